# Converters: how one kind of function takes the call's inputs and gives its
# results.  The driver (bridge.pxi, _run) calls the same five steps for every
# kind; a new kind of call is a new _Converter.
#   NumPy functions (numpy_function, py_func):   _NumpyConverter, below
#   array_function with a framework adapter:      _FrameworkConverter, below
#   py_function (EagerTensors) and its gradient:  _TensorConverter, tensors.pxi


cdef class _Converter:
    """The steps of one call, in the driver's order: inputs, enter, call,
    outputs, leave.  Per-call state lives in the driver's locals (passed
    back in), never on the converter, which calls on other threads share."""

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        """Swaps each input owner in `args` for what the function takes.
        Returns what outputs() needs of the inputs (their memory ranges) or None."""
        raise NotImplementedError

    cdef object enter(self, PfbCall* call):
        """Enters the context the function runs in; returns what leave() undoes
        (None: nothing)."""
        return None

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        """Runs the function; returns its result."""
        return entry.func(*args)

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        """Checks the result against the declaration and fills call.outputs.
        `outside_refs`: references to `result` that the bridge does not hold."""
        raise NotImplementedError

    cdef int leave(self, PfbCall* call, object entered) except -1:
        return 0


cdef class _NumpyConverter(_Converter):
    """NumPy functions: read-only ndarray views in (private copies under
    copy=True), ndarrays and Python values out, allocated 64-byte aligned."""

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        _input_arrays(args, call.copy_mode)
        if counts != NULL:
            _count_inputs(counts, args, call.copy_mode)
        return None

    cdef object enter(self, PfbCall* call):
        # Fresh NumPy arrays must be aligned to be handed over.  On TF's worker
        # threads (no user Python runs there) the handler stays installed; on
        # Python's own threads it is restored after the call.
        if not (call.flags & PFB_CALL_WORKER_THREAD):
            return cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
        if cnp.PyDataMem_GetHandler() is not _aligned_handler_capsule:
            cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
        return None

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        return _export_outputs(call, result, outside_refs, False, None, counts)

    cdef int leave(self, PfbCall* call, object entered) except -1:
        if entered is not None:
            cnp.PyDataMem_SetHandler(entered)
        return 0


cdef class _FrameworkConverter(_NumpyConverter):
    """array_function: the framework's arrays in (through its adapter), any
    DLPack producer out, judged by the adapter of its type."""
    cdef readonly object adapter

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        ranges = _framework_inputs(args, self.adapter, call.copy_mode)
        if counts != NULL:
            _count_inputs(counts, args, call.copy_mode)
        return ranges

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        result = entry.func(*args)
        if call.copy_mode != PFB_COPY_TRUE:
            self.adapter.check_inputs(args)
        return result

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        return _export_outputs(call, result, outside_refs, True, ranges, counts)


cdef _NumpyConverter _NUMPY = _NumpyConverter()


def converter(adapter):
    """The converter of a registry entry: NumPy's for None, else one for the
    array_function framework `adapter`."""
    if adapter is None:
        return _NUMPY
    cdef _FrameworkConverter made = _FrameworkConverter.__new__(_FrameworkConverter)
    made.adapter = adapter
    return made


cdef tuple _input_arrays(tuple args, int copy_mode):
    """Swaps each owner for an ndarray: a read-only view, or a private copy (copy=True)."""
    cdef Py_ssize_t i, n = len(args)
    cdef bint private = copy_mode == PFB_COPY_TRUE
    for i in range(n):
        view = _view(<_DLPackOwner>args[i], False)
        if private and cnp.PyArray_TYPE(view) != cnp.NPY_OBJECT:
            view = np.array(view, copy=True)
        _swap(args, i, view)  # the view holds the owner
    return args


cdef list _framework_inputs(tuple args, object adapter, int copy_mode):
    """Swaps each owner in `args` for the framework's array (strings: object
    arrays).  Returns the inputs' memory ranges [(start, end), ...]."""
    cdef Py_ssize_t i
    cdef DLTensor* t
    cdef bint private = copy_mode == PFB_COPY_TRUE
    cdef list ranges = []
    wrap = adapter.wrap_input
    for i in range(len(args)):
        owner = <_DLPackOwner>args[i]
        t = _owner_tensor(owner)
        if _is_string_dtype(t.dtype):
            value = _view(owner, False)
        else:
            start = <uintptr_t>t.data + t.byte_offset
            ranges.append((start, start + _nbytes(t)))
            value = wrap(owner, private)
        _swap(args, i, value)
    return ranges


cdef inline int _swap(tuple args, Py_ssize_t i, object value) except -1:
    """Replaces args[i] (an input owner) with what the function takes: the
    driver's tuple is reused, so that a call makes no second one."""
    Py_INCREF(value)  # PyTuple_SET_ITEM steals it
    Py_XDECREF(PyTuple_GET_ITEM(args, i))
    PyTuple_SET_ITEM(args, i, value)
    return 0


cdef int _export_outputs(PfbCall* call, object result, Py_ssize_t outside_refs,
                         bint dlpack, list ranges, _CallCounts* counts) except -1:
    """Checks the results against the declaration and exports them.

    `outside_refs`: references to `result` that the bridge does not hold.
    `dlpack`: results exporting __dlpack__ are taken through DLPack
    (array_function); `ranges`: then the inputs' memory ranges.
    `counts`: where to count the bytes (NULL: statistics are off).
    """
    cdef int i, j, held, n = call.num_outputs
    cdef Py_ssize_t refs
    cdef PyObject* item
    if n == 1 and not isinstance(result, (list, tuple)):
        _export_result(call, 0, <PyObject*>result, outside_refs, dlpack, ranges, counts)
        return 0
    if isinstance(result, (list, tuple)) and len(result) == n:
        # The bridge holds each item once per occurrence in `items` (twice for
        # a list: through the list and the tuple made of it), and once more
        # per earlier output already exported from it.  A container that
        # someone else holds still reaches its items.
        items = result if type(result) is tuple else tuple(result)
        per_item = 1 if items is result else 2
        for i in range(n):
            item = PyTuple_GET_ITEM(items, i)
            held = 0
            for j in range(n):
                if PyTuple_GET_ITEM(items, j) == item:
                    held += per_item + (1 if j < i else 0)
            refs = Py_REFCNT(item) - held + (1 if outside_refs > 0 else 0)
            _export_result(call, i, item, refs, dlpack, ranges, counts)
        return 0
    _check_count(result, n, _ONE_ARRAY)  # raises unless n == 0 and result is None
    return 0


cdef inline int _export_result(PfbCall* call, int i, PyObject* item, Py_ssize_t refs,
                               bint dlpack, list ranges, _CallCounts* counts) except -1:
    if not dlpack or PyArray_Check(item):
        call.outputs[i] = _export_output(item, refs, i, &call.output_specs[i],
                                         call.copy_mode, counts)
    else:
        call.outputs[i] = _export_dlpack_output(item, refs, i, &call.output_specs[i],
                                                call.copy_mode, ranges, counts)
    return 0
