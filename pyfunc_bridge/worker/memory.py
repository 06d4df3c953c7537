"""What a worker holds across calls: its shared memory (the input blocks its
arrays still view, the result arena) and its copy facts' rules."""
import weakref

from .compiled import pool_module
from .copy_facts import CopyFacts, address
from .values import CONVERTED_BY_THE_PARENT, as_numpy

# NumPy allocations of at least this many bytes that a function makes go to
# the result arena: copying a smaller result costs less than a wake-up, and
# small arrays a function keeps (caches, constants made on first use) would
# scatter over the arena and split its free space.
_ARENA_MIN_BYTES = 64 << 10


class WorkerMemory(CopyFacts):
    """What the worker holds across calls: its mappings, the input blocks its
    arrays still view, the result arena, and (CopyFacts) the copy facts'
    rules over them."""

    def __init__(self, sock, np, input_map, result_map):
        super().__init__(np, input_map)
        self.sock = sock
        self.results = np.frombuffer(result_map, np.uint8)
        # The result arena's allocator and NumPy handler (src/pool/): a fresh
        # result of the function is already in shared memory.
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
            # An object exporting an array (a memoryview, an mmap, one with
            # __array__): the parent would take np.asarray of it, and it
            # may not pickle.
            try:
                arr = np.asarray(value)
            except Exception:  # noqa: BLE001 - the parent reports what it is
                arr = None
            if arr is not None and arr.dtype.kind != "O":
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
