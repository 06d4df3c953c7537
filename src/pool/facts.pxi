# A worker's copy facts (docs/pool.md, copy=False): the conversion layer's
# own rule (copy_facts.h) judged on the worker's memory, where an input's
# memory (an input block: np.frombuffer's memoryview of the input arena; or
# a pulled input's memoryview, WorkerMemory.pulled_input) stands for
# TensorFlow's input memory.  pyfunc_bridge/worker/memory.py (WorkerMemory) calls these.

cdef extern from "Python.h":
    ctypedef struct Py_buffer_obj "Py_buffer":
        void* buf
        PyObject* obj
    Py_buffer_obj* PyMemoryView_GET_BUFFER(PyObject* view)
    PyTypeObject PyMemoryView_Type


cdef struct _InputArena:
    PyObject* input_map  # the input arena's mapping
    PyObject* pulled     # the pulled inputs' memoryviews by id (WorkerMemory.pulled)
    bint read_only       # inputs stand for read-only TF memory


cdef int _foreign_end(PyObject* end, void* ctx) noexcept:
    return PFB_END_FOREIGN


cdef int _input_block_end(PyObject* end, void* ctx) noexcept:
    """An input's memory, a block or pulled, is read-only TF memory
    in-process, or (writable) the call's alone while only the chain holds it
    (its one weak reference is the worker's: WorkerMemory.input_block,
    pulled_input)."""
    cdef _InputArena* inputs = <_InputArena*>ctx
    cdef Py_ssize_t refs = Py_REFCNT(end)  # (before <object>end below takes one)
    if Py_TYPE(end) != &PyMemoryView_Type or (
            PyMemoryView_GET_BUFFER(end).obj != inputs.input_map
            and id(<object>end) not in <object>inputs.pulled):
        return PFB_END_FOREIGN
    if inputs.read_only:
        return PFB_END_READ_ONLY
    return PFB_END_PRIVATE if refs == 1 else PFB_END_FOREIGN


def writable_elsewhere(cnp.ndarray arr not None, Py_ssize_t outside_refs, bint read_only,
                       input_map, pulled):
    """Whether Python could write result `arr`'s memory after the call, as the
    conversion layer judges in-process (`outside_refs`: references to it the
    worker does not hold; `read_only`: inputs are read-only; `pulled`: the
    pulled inputs' memoryviews by id)."""
    cdef _InputArena judged = _InputArena(<PyObject*>input_map, <PyObject*>pulled, read_only)
    return pfb_writable_elsewhere(<PyObject*>arr, outside_refs, _input_block_end, &judged)


def layout(cnp.ndarray arr not None, pulled=None):
    """(compact, aligned) of `arr` as the parent would find them in-process,
    where its allocator aligns every fresh array, and TensorFlow every input
    (`pulled`, as writable_elsewhere's: a view of a pulled input is aligned
    where its offset into it is)."""
    aligned = pfb_array_aligned(<PyObject*>arr, PFB_POOL_ALIGN, True)
    if not aligned and pulled:
        end = (<object>arr).base  # (the Python attribute: cnp.ndarray.base is a pointer)
        while isinstance(end, cnp.ndarray):
            end = end.base
        if type(end) is memoryview and id(end) in pulled:
            aligned = (<uintptr_t>cnp.PyArray_DATA(arr)
                       - <uintptr_t>PyMemoryView_GET_BUFFER(<PyObject*>end).buf) % PFB_POOL_ALIGN == 0
    return (PyArray_IS_C_CONTIGUOUS(<PyArrayObject*>arr), aligned)


def outside_refs(tuple items, result, Py_ssize_t result_outside):
    """Per item of `items` (iterating the function's list or tuple `result`,
    to which the worker holds all but `result_outside` references) the
    references to it the worker does not hold, counted as in-process."""
    return [pfb_item_outside_refs(<PyObject*>items, <PyObject*>result, i, result_outside)
            for i in range(len(items))]


def inside(uintptr_t start, uintptr_t nbytes, list ranges not None):
    """Whether that memory lies in one of the call's input blocks, `ranges`:
    TensorFlow's memory in-process, so a view of it is not foreign."""
    return pfb_inside(start, nbytes, ranges) == 1
