"""A result's copy facts, gathered in the worker for the parent's copy=False."""
import weakref

from .compiled import pool_module
from .values import CONVERTED_BY_THE_PARENT, framework_adapter, frameworks

# What the parent's copy decision (_copy_reason, src/conversion/copy.pxi)
# would have known of a result in-process: the parent sees only blocks of
# the result arena (a fresh result as it is, anything else copied), yet
# copy=False must refuse what it refuses in-process.  The facts are judged
# here by the conversion layer's own rule (src/copy_facts.h, through
# the pool module's facts.pxi); the parent decides.

_CLEAN = (False, True, True, False)  # facts that copy=False refuses nothing for


def address(arr):
    return arr.__array_interface__["data"][0]


class CopyFacts:
    """The copy facts' rules over a worker's memory: what an array views (an
    input block, memory the function allocated, memory it did not) decides
    whether anything else can write it.  WorkerMemory holds the memory."""

    def __init__(self, np, input_map):
        self.np = np
        self.input_map = input_map  # the input arena: its blocks are input blocks
        # id() -> the memoryview of each pulled input (WorkerMemory.pulled_input,
        # by id: a writable one does not hash): input memory too, as a block is.
        self.pulled = weakref.WeakValueDictionary()
        self.facts = pool_module()  # copy_facts.h's rule (facts.pxi)

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
            facts = (self.facts.writable_elsewhere(value, outside, read_only, self.input_map,
                                                   self.pulled),
                     *self.facts.layout(value, self.pulled), False)
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
            facts = (True, *self.facts.layout(arr), False)
        return None if facts is None or facts == _CLEAN else facts

    def items_facts(self, values, result, outside, writable, framework, ranges):
        """one_facts of each of `values`, the items of the function's list or
        tuple `result` (as a tuple), to which the worker holds all but
        `outside` references."""
        counts = self.facts.outside_refs(values, result, outside)  # before any reference
        return [self.one_facts(values[i], counts[i], writable, framework, ranges)
                for i in range(len(values))]

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
        if foreign and self.facts.inside(address(arr), arr.nbytes, ranges):
            foreign = False  # a view of an input: TensorFlow's memory in-process
        return (foreign, *self.facts.layout(arr, self.pulled), lazy)
