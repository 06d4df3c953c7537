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
    copy=True), ndarrays and Python values out, allocated 64-byte aligned.
    `scalars`: 0-d inputs arrive as NumPy scalars (bytes for strings), as
    TensorFlow hands them over in graphs; eager entries get 0-d arrays, as
    TF's eager numpy_function does (_NUMPY_EAGER)."""
    cdef readonly bint scalars

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        _input_arrays(args, call.copy_mode, self.scalars, counts)
        return None

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        result = entry.func(*args)
        return _flat_mapping(result) if not self.scalars else result

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
        return _export_outputs(call, result, outside_refs, False, None, counts, None,
                               _converts(self, call))

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
            _count_inputs(counts, args, _numeric_counter(counts, call.copy_mode))
        return ranges

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        result = entry.func(*args)
        if call.copy_mode == PFB_COPY_FALSE:  # otherwise every input is the call's own
            self.adapter.check_inputs(args)
        return result

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        return _export_outputs(call, result, outside_refs, True, ranges, counts)


cdef inline bint _converts(_NumpyConverter converter, PfbCall* call):
    """Whether a result of another dtype converts where no value changes:
    eagerly, as TF's eager numpy_function returns it unchecked (its inputs
    are np.array's, int64 for a Python int, whatever Tout says); not under
    copy=False, for which a conversion is a copy."""
    return not converter.scalars and call.copy_mode != PFB_COPY_FALSE


cdef object _flat_mapping(object result):
    """An eager NumPy function's result as TF's eager numpy_function takes it:
    a mapping as nest.flatten gives it (its values by sorted key), anything
    else as it is (in graphs a mapping has no tensor form: INTERNAL, as TF)."""
    if not isinstance(result, Mapping):
        return result
    from tensorflow.python.util import nest
    return nest.flatten(result)


cdef _NumpyConverter _NUMPY = _NumpyConverter()
_NUMPY.scalars = True
cdef _NumpyConverter _NUMPY_EAGER = _NumpyConverter()


cdef dict _FRAMEWORK_CONVERTERS = {}  # adapter -> its _FrameworkConverter


def converter(adapter, bint eager=False):
    """The converter of a registry entry: NumPy's for None (`eager`: the one
    for eager calls, which hands 0-d inputs over as 0-d arrays), else one for
    the array_function framework `adapter` (0-d arrays always: torch and JAX
    have no scalar type)."""
    if adapter is None:
        return _NUMPY_EAGER if eager else _NUMPY
    made = _FRAMEWORK_CONVERTERS.get(adapter)
    if made is None:
        # Converters keep no per-call state: one per adapter serves every entry
        # (an eager array_function call makes an entry per call).
        made = _FrameworkConverter.__new__(_FrameworkConverter)
        (<_FrameworkConverter>made).adapter = adapter
        _FRAMEWORK_CONVERTERS[adapter] = made
    return made


cdef object _scalar_input(object view):
    """A 0-d input as TensorFlow hands it over in a graph: a NumPy scalar of its
    dtype (``np.float32``, ``np.bool_``, ...; bytes for tf.string), a value
    that holds nothing of TF's memory."""
    return view[()]


cdef bint _own_input(_DLPackOwner owner, int copy_mode):
    """Whether an input is the call's alone (IS_COPIED, bridge_abi.h: TF's
    buffer that nothing else references, or a copy), so that under copy=None
    the function may write it without a copy; marks the owner so."""
    owner.private = (copy_mode == PFB_COPY_NONE and owner.managed != NULL
                     and owner.managed.flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0)
    return owner.private


cdef int64_t* _input_counter(_CallCounts* counts, int copy_mode, bint own) noexcept:
    """Where a numeric input's bytes count under the input policy (_input_arrays)."""
    if copy_mode == PFB_COPY_NONE and not own:
        return &counts.copied[_SHARED_INPUT]
    return _numeric_counter(counts, copy_mode)


cdef tuple _input_arrays(tuple args, int copy_mode, bint scalars, _CallCounts* counts):
    """Swaps each owner for an ndarray, by the input policy: under copy=None
    writable, a zero-copy view of memory that is the call's alone and a
    private copy of memory TF shares ("shared_input"); a private copy under
    copy=True; a read-only view under copy=False.  With `scalars`, a 0-d input
    becomes a NumPy scalar (_scalar_input).  Counts each input into `counts`
    (NULL: not counted) in the same pass."""
    cdef Py_ssize_t i, n = len(args)
    cdef bint own
    for i in range(n):
        own = _own_input(<_DLPackOwner>args[i], copy_mode)
        view = _view(<_DLPackOwner>args[i], own)
        if scalars and cnp.PyArray_NDIM(view) == 0:
            view = _scalar_input(view)
        elif (copy_mode != PFB_COPY_FALSE and not own
                and cnp.PyArray_TYPE(view) != cnp.NPY_OBJECT):
            view = cnp.PyArray_NewCopy(<cnp.ndarray>view, cnp.NPY_CORDER)
        if counts != NULL:
            _count_input(counts, view, _input_counter(counts, copy_mode, own))
        _swap(args, i, view)  # the view (or the scalar) replaces the owner
    return args


cdef list _framework_inputs(tuple args, object adapter, int copy_mode):
    """Swaps each owner in `args` for the framework's array (strings: object
    arrays).  Returns the inputs' memory ranges [(start, end), ...]."""
    cdef Py_ssize_t i
    cdef DLTensor* t
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
            # The input policy (_input_arrays) for frameworks that can write
            # their arrays; an immutable framework's (JAX) need no copy.
            value = wrap(owner, copy_mode == PFB_COPY_TRUE or (
                copy_mode == PFB_COPY_NONE and adapter.mutable
                and not _own_input(owner, copy_mode)))
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
                         bint dlpack, list ranges, _CallCounts* counts,
                         list refused=None, bint convert=False) except -1:
    """Checks the results against the declaration and exports them.

    `outside_refs`: references to `result` that the bridge does not hold.
    `dlpack`: results exporting __dlpack__ are taken through DLPack
    (array_function); `ranges`: then the inputs' memory ranges.
    `counts`: where to count the bytes (NULL: statistics are off).
    `refused`: for a worker process's result (executor=), per value the
    reason copy=False refuses what the function returned (None: none), which
    replaces the decision on the pool's own copy (_export_output's `pooled`).
    `convert`: results of another dtype convert where no value changes
    (eager NumPy functions; _export_output's).
    """
    cdef int i, n = call.num_outputs
    if n == 1 and result is not None and not isinstance(result, (list, tuple)):
        _export_result(call, 0, <PyObject*>result, outside_refs, dlpack, ranges, counts, True,
                       refused, convert)
        return 0
    items = None
    if isinstance(result, (list, tuple)):
        # The objects converted are those iteration yields (as for TF's
        # numpy_function).  The references the bridge can account for are
        # counted from where they really are: one per occurrence in `items`
        # and, for a list or tuple made from `result`, one per occurrence in
        # its storage, read directly (a subclass may yield from __iter__
        # objects it does not hold, or claim a __len__ it does not have).  A
        # container that someone else holds still reaches its items.  Every
        # count is taken before the first export adds references.
        items = result if type(result) is tuple else tuple(result)
        if PyTuple_GET_SIZE(items) == n:
            outside = [pfb_item_outside_refs(<PyObject*>items, <PyObject*>result, i,
                                             outside_refs) for i in range(n)]
            for i in range(n):
                _export_result(call, i, PyTuple_GET_ITEM(items, i), outside[i], dlpack,
                               ranges, counts, False, refused, convert)
            return 0
    # Raises unless n == 0 and result is None (None is 0 values); counts
    # what iteration yielded.
    _check_count(result if items is None else items, n, _ONE_ARRAY)
    return 0


cdef inline int _export_result(PfbCall* call, int i, PyObject* item, Py_ssize_t refs,
                               bint dlpack, list ranges, _CallCounts* counts,
                               bint sole=False, list refused=None,
                               bint convert=False) except -1:
    if refused is not None:  # a worker's result: an ndarray or a Python value
        call.outputs[i] = _export_output(item, refs, i, &call.output_specs[i],
                                         call.copy_mode, counts, sole, True,
                                         refused[i] if i < len(refused) else None, convert)
    elif not dlpack or PyArray_Check(item):
        call.outputs[i] = _export_output(item, refs, i, &call.output_specs[i],
                                         call.copy_mode, counts, sole, False, None, convert)
    else:
        call.outputs[i] = _export_dlpack_output(item, refs, i, &call.output_specs[i],
                                                call.copy_mode, ranges, counts, call.stream)
    return 0
