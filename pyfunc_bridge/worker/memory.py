"""What a worker holds across calls: its shared memory (the input blocks its
arrays still view, the result arena) and its copy facts' rules over it."""
import weakref

from .compiled import pool_module
from .values import CONVERTED_BY_THE_PARENT, as_numpy, framework_adapter, frameworks

# NumPy allocations of at least this many bytes that a function makes go to
# the result arena: copying a smaller result costs less than a wake-up, and
# small arrays a function keeps (caches, constants made on first use) would
# scatter over the arena and split its free space.
_ARENA_MIN_BYTES = 64 << 10

# The copy facts: what the parent's copy decision (_copy_reason,
# src/conversion/copy.pxi) would have known of a result in-process.  The
# parent sees only blocks of the result arena (a fresh result as it is,
# anything else copied), yet copy=False must refuse what it refuses
# in-process: the facts are judged here by the conversion layer's own rule
# (src/copy_facts.h, through the pool module's facts.pxi); the parent decides.
_CLEAN = (False, True, True, False)  # facts that copy=False refuses nothing for


def address(arr):
    return arr.__array_interface__["data"][0]


def _exported_array(np, value):
    """np.asarray of an object exporting an array (a memoryview, an mmap, one
    with __array__), as the parent takes it; None for one that does not, or
    that holds objects."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - the parent reports what it is
        return None
    return None if arr.dtype.kind == "O" else arr


class WorkerMemory:
    """What the worker holds across calls: its mappings, the input blocks its
    arrays still view, the result arena, and the copy facts' rules over them
    (what an array views, an input block, memory the function allocated or
    memory it did not, decides whether anything else can write it)."""

    def __init__(self, np, input_map, result_map):
        self.np = np
        self.input_map = input_map  # the input arena: its blocks are input blocks
        # id() -> the memoryview of each pulled input (pulled_input, by id: a
        # writable one does not hash): input memory too, as a block is.
        self.pulled = weakref.WeakValueDictionary()
        self.results = np.frombuffer(result_map, np.uint8)
        # The result arena's allocator and NumPy handler, and copy_facts.h's
        # rule (src/pool/): a fresh result of the function is already in
        # shared memory.
        self.pw = pool_module()
        self.arena = self.pw.ResultArena(result_map, _ARENA_MIN_BYTES)
        # id(weak reference) -> (the reference, offset) of each input block
        # something here still views; the reference's callback moves the
        # block's offset to `inputs_freed`, which INPUTS_BACK carries.
        self.input_blocks = {}
        self.inputs_freed = []

    def input_block(self, offset, size):
        """A uint8 ndarray over one input block, the base of every view of it.

        Its own base is not an ndarray (np.frombuffer makes a memoryview), so
        NumPy stops collapsing views' bases at it: every view, view of a view
        and torch tensor made from one keeps it alive, and its weak reference's
        callback runs when the last of them goes, whenever that is."""
        block = self.np.frombuffer(self.input_map, self.np.uint8, count=size, offset=offset)
        # The weak reference is to its memoryview, which dies with it: the
        # copy facts' rule then sees the block as any other array of a chain.
        ref = weakref.ref(block.base, self._input_gone)
        self.input_blocks[id(ref)] = (ref, offset)
        return block

    def pulled_input(self, value):
        """`value`, an input pulled over the socket, as a view of a memoryview
        the copy facts then know for an input's memory, as a block's (the
        call's input memory, as TensorFlow's is in-process), not as memory
        the function found.  Unpickled, an array views bytes or a bytearray."""
        np = self.np
        end = value
        while isinstance(end, np.ndarray):
            end = end.base
        if end is None or end is value:
            return value  # (not an array, or one owning its data: the call's already)
        try:
            flat = np.frombuffer(memoryview(end), np.uint8)  # (its base: a memoryview)
            view = np.ndarray(value.shape, value.dtype, flat, address(value) - address(flat),
                              value.strides)
        except (TypeError, ValueError):
            return value
        self.pulled[id(flat.base)] = flat.base
        return view

    def _input_gone(self, ref):
        _, offset = self.input_blocks.pop(id(ref))
        self.inputs_freed.append(offset)  # INPUTS_BACK names a block by its offset

    def result(self, value, framework, flags, index=0):
        """(the tensor record of `value` (output `index`) in a block of the
        result arena, with `flags`, or None; `value` as NumPy's, which the
        caller encodes otherwise when there is no record)."""
        np = self.np
        value = as_numpy(np, value, framework, index)
        if not isinstance(value, (np.ndarray, np.generic, *CONVERTED_BY_THE_PARENT,
                                  type(None))):
            # (It may not pickle: sent as the parent would take it.)
            arr = _exported_array(np, value)
            if arr is not None:
                value = arr
        # Numbers only, in a dtype the records name (dl_dtype): the parent
        # converts strings and checks every other dtype itself.
        dl = None
        if isinstance(value, np.ndarray) and value.size:
            dl = self.pw.dl_dtype(value.dtype)
        if dl is None:
            return None, value
        block = self.arena.take(value)
        if block is not None:  # the function's own arena memory: no copy
            flags |= self.pw.TENSOR_SHARED
        else:
            block = self.arena.reserve(value.nbytes)
            if block is None:
                return None, value
            out = self.results[block[0]:block[0] + value.nbytes].view(value.dtype)
            np.copyto(out.reshape(value.shape), value, casting="no")
        return (*dl, flags, *block, value.shape), value

    def one_facts(self, value, outside, read_only, framework, ranges):
        """(writable_elsewhere, compact, aligned, lazy) of a result as the
        function returned it, or None when copy=False refuses nothing (an
        empty array, a fresh compact aligned one, a value converted anew).
        `outside`: references to it the worker does not hold; `read_only`:
        the call's input blocks stand for read-only TF memory (ring_server's
        inputs_writable decides); `framework`: array_function's (DLPack
        producers judged by their adapter); `ranges`: the call's input
        blocks' addresses."""
        np = self.np
        if isinstance(value, np.ndarray):
            if not value.size:
                return None
            facts = (self.pw.writable_elsewhere(value, outside, read_only, self.input_map,
                                                self.pulled),
                     *self.pw.layout(value, self.pulled), False)
        elif (framework is not None and hasattr(type(value), "__dlpack__")
              and not isinstance(value, np.generic)):
            facts = self.dlpack_facts(value, outside, ranges)
        elif isinstance(value, (np.generic, *CONVERTED_BY_THE_PARENT)) or value is None:
            return None  # converted to a fresh array
        else:  # an object exporting an array: its memory is not ours (aliasing)
            arr = _exported_array(np, value)
            if arr is None or not arr.size:
                return None
            facts = (True, *self.pw.layout(arr), False)
        return None if facts is None or facts == _CLEAN else facts

    def dlpack_facts(self, value, outside, ranges):
        """_export_dlpack_output's facts (frameworks.pxi) of a DLPack
        producer: its adapter's resolve (lazy views) and writable_elsewhere,
        a view of an input being TensorFlow's memory, and the layout."""
        adapter = framework_adapter(value)
        value, lazy = frameworks().resolved(adapter, value)
        foreign = not lazy and (adapter.writable_elsewhere(value, outside)
                                if adapter is not None else True)
        try:
            source = value.detach() if hasattr(value, "detach") else value
            if type(value).__module__.startswith("torch") and str(source.dtype) == "torch.bfloat16":
                import torch
                # NumPy's DLPack has no bfloat16; its bits are int16 (not
                # .numpy(), which marks the storage not resizable, as
                # writable_elsewhere would then judge the next result of it).
                source = source.view(torch.int16)
            arr = self.np.from_dlpack(source)
        except Exception:  # noqa: BLE001 - the parent reports what it is
            return None
        if not arr.size:
            return None
        if foreign and self.pw.inside(address(arr), arr.nbytes, ranges):
            foreign = False  # a view of an input: TensorFlow's memory in-process
        return (foreign, *self.pw.layout(arr, self.pulled), lazy)
