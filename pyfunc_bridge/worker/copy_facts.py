"""A result's copy facts, gathered in the worker for the parent's copy=False."""
import sys
import weakref

from .values import CONVERTED_BY_THE_PARENT, framework_adapter

ALIGN = 64  # PFB_TENSOR_ALIGNMENT (src/bridge_abi.h): TF's Eigen kernels need it

# What the parent's copy decision (_copy_reason, src/conversion/copy.pxi)
# would have known of a result in-process: the parent sees only blocks of
# the result arena (a fresh result as it is, anything else copied), yet
# copy=False must refuse what it refuses in-process.  The facts are gathered
# here as the conversion layer gathers them (_array_writable_elsewhere and
# _export_output for arrays, _export_dlpack_output and the framework's
# adapter for DLPack producers); the parent decides.

_CLEAN = (False, True, True, False)  # facts that copy=False refuses nothing for


def address(arr):
    return arr.__array_interface__["data"][0]


def _aligned(np, arr):
    """Whether `arr` would be aligned in-process, where NumPy allocates
    every fresh array aligned (the bridge's allocator, alloc.pxi) and this
    worker's NumPy does not: a view of an array that owns its data is
    aligned where its offset into that array is; any other memory where its
    address is."""
    last = arr
    while isinstance(last.base, np.ndarray):
        last = last.base
    start = address(last) if last.base is None and last.flags.owndata else 0
    return (address(arr) - start) % ALIGN == 0


def _stored(container, item):
    """How often the list or tuple `container` holds `item`."""
    return sum(1 for x in container if x is item)


def _outside_of(items, container, i, container_outside):
    """References to result item `i` that the worker does not hold, counted
    as _export_outputs counts them (`items`: the tuple iterated)."""
    held = _stored(items, items[i])
    if items is not container:
        held += _stored(container, items[i])
    # getrefcount's argument is the one reference beyond those counted.
    return sys.getrefcount(items[i]) - 1 - held + (1 if container_outside > 0 else 0)


class CopyFacts:
    """The copy facts' rules over a worker's memory: what an array views (an
    input block, memory the function allocated, memory it did not) decides
    whether anything else can write it.  WorkerMemory holds the memory."""

    def __init__(self, np, input_map):
        self.np = np
        self.input_map = input_map  # the input arena: its blocks are input blocks

    def one_facts(self, value, outside, writable, framework, ranges):
        """(writable_elsewhere, compact, aligned, lazy) of a result as the
        function returned it, or None when copy=False refuses nothing (an
        empty array, a fresh compact aligned one, a value converted anew).
        `outside`: references to it the worker does not hold; `writable`:
        copy=True; `framework`: array_function's (DLPack producers judged by
        their adapter); `ranges`: the call's input blocks' addresses."""
        np = self.np
        # The input blocks are read-only, as TF's memory is in-process,
        # except under copy=True and for torch (which has no read-only tensors).
        read_only = not writable and framework != "torch"
        if isinstance(value, np.ndarray):
            if not value.size:
                return None
            facts = (self.writable_elsewhere(value, outside, read_only),
                     value.flags.c_contiguous, _aligned(np, value), False)
        elif (framework is not None and hasattr(type(value), "__dlpack__")
              and not isinstance(value, np.generic)):
            facts = self.dlpack_facts(value, outside, ranges)
        elif isinstance(value, (np.generic, *CONVERTED_BY_THE_PARENT)) or value is None:
            return None  # converted to a fresh array
        else:  # an object exporting an array: its memory is not ours (aliasing)
            try:
                arr = np.asarray(value)
            except Exception:  # noqa: BLE001 - the parent reports what it is
                return None
            if arr.dtype.kind == "O" or not arr.size:
                return None
            facts = (True, arr.flags.c_contiguous, _aligned(np, arr), False)
        return None if facts is None or facts == _CLEAN else facts

    def items_facts(self, values, result, outside, writable, framework, ranges):
        """one_facts of each of `values`, the items of the function's list or
        tuple `result` (as a tuple), to which the worker holds all but
        `outside` references."""
        facts = []
        for i in range(len(values)):
            item_outside = _outside_of(values, result, i, outside)  # counted first
            facts.append(self.one_facts(values[i], item_outside, writable, framework, ranges))
        return facts

    def writable_elsewhere(self, value, outside, read_only):
        """_array_writable_elsewhere (copy.pxi) in the worker: whether Python
        could write the array's memory after the call.  An input block plays
        the read-only input view's part (or, written under copy=True, that of
        an array that owns its data); its one weak reference is this
        worker's (input_block)."""
        np = self.np
        exclusive = outside == 0 and not weakref.getweakrefcount(value)
        last = value
        base = value.base
        while isinstance(base, np.ndarray):
            ours = self.is_input_block(base)
            # References: its successor's base, `base` here, getrefcount's argument.
            if (sys.getrefcount(base) != 3
                    or weakref.getweakrefcount(base) != (1 if ours else 0)):
                exclusive = False
            last = base
            base = base.base
        if base is not None:
            if not self.is_input_block(last):
                exclusive = False  # memory the function did not allocate
            elif read_only:
                exclusive = True   # nobody can write an input block (TF's memory in-process)
        elif not last.flags.owndata:
            exclusive = False
        return not exclusive

    def is_input_block(self, arr):
        base = arr.base
        return type(base) is memoryview and base.obj is self.input_map

    def dlpack_facts(self, value, outside, ranges):
        """_export_dlpack_output's facts (frameworks.pxi) of a DLPack
        producer: its adapter's resolve (lazy views) and writable_elsewhere,
        a view of an input being TensorFlow's memory, and the layout."""
        adapter = framework_adapter(value)
        lazy = False
        resolve = getattr(adapter, "resolve", None)
        if resolve is not None:
            resolved = resolve(value)
            if resolved is not None:
                value, lazy = resolved, True
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
        start = address(arr)
        if foreign and any(lo <= start and start + arr.nbytes <= hi for lo, hi in ranges):
            foreign = False  # a view of an input: TensorFlow's memory in-process
        return (foreign, arr.flags.c_contiguous, start % ALIGN == 0, lazy)
