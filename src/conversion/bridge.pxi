# The entry point the kernel calls, the function registry it reads, and the
# capsule that publishes both to the kernel.

# key -> weakref to an entry with a `.func`; written by the op layer
# (pyfunc_bridge/_registry.py), which keeps each entry alive with its graphs.
cdef dict _functions = {}
# Eagerly executed ops run their kernel on the calling thread: the op layer
# puts the function here for the duration of the call.
_eager = threading.local()
EAGER_KEY = "pyfunc_bridge:eager"
cdef bytes _EAGER_KEY_BYTES = EAGER_KEY.encode()
cdef const char* _EAGER_KEY_C = _EAGER_KEY_BYTES
cdef size_t _EAGER_KEY_LEN = len(_EAGER_KEY_BYTES)


def registry():
    """The dict the bridge resolves keys in (key -> weakref of an entry)."""
    return _functions


cdef object _lookup(const char* key, size_t key_len):
    if key_len == _EAGER_KEY_LEN and memcmp(key, _EAGER_KEY_C, key_len) == 0:
        entry = getattr(_eager, "entry", None)
    else:
        ref = _functions.get(key[:key_len].decode("utf-8"))
        entry = ref() if ref is not None else None
    if entry is None:
        raise ValueError(
            f"pyfunc_bridge: no Python function is registered under key "
            f"{key[:key_len].decode('utf-8', 'replace')!r}. Functions live as long "
            f"as the graphs or tf.functions that created them; keep that graph or "
            f"function alive while its ops run")
    return entry


cdef tuple _adopt_inputs(PfbCall* call):
    """One owner per input, each freeing its input on every path."""
    cdef Py_ssize_t i, n = call.num_inputs
    cdef tuple args
    cdef _DLPackOwner owner
    try:
        args = PyTuple_New(n)
    except BaseException:
        for i in range(n):
            call.inputs[i].deleter(call.inputs[i])
        raise
    # Adopt every input first (only MemoryError can interrupt): from here on
    # each one is freed on every path, by its owner.
    for i in range(n):
        try:
            owner = _adopt(call.inputs[i])
        except BaseException:
            for i in range(i, n):
                call.inputs[i].deleter(call.inputs[i])
            raise
        Py_INCREF(owner)  # PyTuple_SET_ITEM steals it
        PyTuple_SET_ITEM(args, i, owner)
    return args


cdef tuple _input_arrays(tuple args, int copy_mode):
    """Swaps each owner for an ndarray: a read-only view, or a private copy (copy=True)."""
    cdef Py_ssize_t i, n = len(args)
    cdef bint private = copy_mode == PFB_COPY_TRUE
    for i in range(n):
        view = _view(<_DLPackOwner>args[i], False)
        if private and cnp.PyArray_TYPE(view) != cnp.NPY_OBJECT:
            view = np.array(view, copy=True)
        # Swap the owner for its view (the view holds the owner).
        Py_INCREF(view)
        Py_XDECREF(PyTuple_GET_ITEM(args, i))
        PyTuple_SET_ITEM(args, i, view)
    return args


cdef int _export_outputs(PfbCall* call, object result, Py_ssize_t outside_refs,
                         list ranges, _CallCounts* counts) except -1:
    """Checks the results against the declaration and exports them.

    `outside_refs`: references to `result` that the bridge does not hold.
    `ranges`: None for NumPy functions; for array_function the inputs' memory
    ranges, and results exporting __dlpack__ are taken through DLPack.
    `counts`: where to count the bytes (NULL: statistics are off).
    """
    cdef int i, n = call.num_outputs
    cdef Py_ssize_t held
    cdef Py_ssize_t refs
    cdef PyObject* item
    if n == 1 and not isinstance(result, (list, tuple)):
        if ranges is None or PyArray_Check(<PyObject*>result):
            call.outputs[0] = _export_output(<PyObject*>result, outside_refs, 0,
                                             &call.output_specs[0], call.copy_mode, counts)
        else:
            call.outputs[0] = _export_dlpack_output(<PyObject*>result, outside_refs, 0,
                                                    &call.output_specs[0], call.copy_mode,
                                                    ranges, counts)
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
            outside = []
            for i in range(n):
                item = PyTuple_GET_ITEM(items, i)
                held = _stored(items, item)
                if items is not result:
                    held += _stored(result, item)
                outside.append(Py_REFCNT(item) - held + (1 if outside_refs > 0 else 0))
            for i in range(n):
                item = PyTuple_GET_ITEM(items, i)
                refs = outside[i]
                if ranges is None or PyArray_Check(item):
                    call.outputs[i] = _export_output(item, refs, i, &call.output_specs[i],
                                                     call.copy_mode, counts)
                else:
                    call.outputs[i] = _export_dlpack_output(item, refs, i,
                                                            &call.output_specs[i],
                                                            call.copy_mode, ranges, counts)
            return 0
    _check_count(result if items is None else items, n)  # raises unless n == 0 and result is None
    return 0


cdef Py_ssize_t _stored(object container, PyObject* item):
    """How often the list or tuple `container` holds `item` in its storage
    (0 for any other object, whatever isinstance says of it)."""
    cdef Py_ssize_t i, count = 0
    if PyList_Check(container):
        for i in range(PyList_GET_SIZE(container)):
            if PyList_GET_ITEM(container, i) == item:
                count += 1
    elif PyTuple_Check(container):
        for i in range(PyTuple_GET_SIZE(container)):
            if PyTuple_GET_ITEM(container, i) == item:
                count += 1
    return count


cdef int _run(PfbCall* call) except -1:
    cdef int i
    cdef _CallCounts counts
    cdef _CallCounts* counting = _stats_begin(&counts)  # NULL: statistics off
    if call.flags & (PFB_CALL_TENSORS | PFB_CALL_GRADIENT):
        return _run_py_function(call, counting)
    args = _adopt_inputs(call)
    entry = _lookup(call.key, call.key_len)
    # None: a NumPy function; else the framework adapter of an array_function
    # (frameworks.pxi).
    adapter = entry.framework
    cdef list ranges = None
    if adapter is None:
        _input_arrays(args, call.copy_mode)
    else:
        ranges = _framework_inputs(args, adapter, call.copy_mode)
    # Fresh NumPy arrays must be 64-byte aligned to be handed over.  On TF's
    # worker threads (no user Python runs there) the handler stays installed;
    # on Python's own threads it is restored after the call.
    cdef bint restore = not (call.flags & PFB_CALL_WORKER_THREAD)
    previous_handler = None
    if restore:
        previous_handler = cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
    elif cnp.PyDataMem_GetHandler() is not _aligned_handler_capsule:
        cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
    try:
        if counting != NULL:
            _stats_call(counting, args, call.copy_mode)
        result = entry.func(*args)
        if counting != NULL:
            counting.returned = _now()
        if adapter is not None and call.copy_mode != PFB_COPY_TRUE:
            adapter.check_inputs(args)
        args = None  # the inputs are no longer ours
        # `result` is our only reference: the rest belong to someone else.
        _export_outputs(call, result, Py_REFCNT(<PyObject*>result) - 1, ranges, counting)
    except BaseException:
        for i in range(call.num_outputs):
            if call.outputs[i] != NULL:
                # Its own deleter: array_function outputs may be foreign tensors.
                call.outputs[i].deleter(call.outputs[i])
                call.outputs[i] = NULL
        if counting != NULL:
            _stats_end(counting, entry, True)
        raise
    finally:
        if restore:
            cnp.PyDataMem_SetHandler(previous_handler)
    if counting != NULL:
        _stats_end(counting, entry, False)
    return 0


cdef int _run_py_function(PfbCall* call, _CallCounts* counting) except -1:
    cdef int i
    try:
        if call.flags & PFB_CALL_GRADIENT:
            _run_gradient(call)
        else:
            _run_tensors(call, counting)
    except BaseException:
        for i in range(call.num_outputs):
            if call.outputs[i] != NULL:
                call.outputs[i].deleter(call.outputs[i])
                call.outputs[i] = NULL
        raise
    return 0


cdef object _OpError = None


cdef bint _raised_as_is(PfbCall* call, object exc) except -1:
    """Whether the eager caller re-raises `exc` itself instead of the TF error
    of the status, as TensorFlow's eager numpy_function and py_func do for
    exceptions our table would turn into another class: a BaseException that
    is no Exception (SystemExit, KeyboardInterrupt) and a TF error (which keeps
    its class).  Eager py_function calls map them, as TF's py_function does."""
    global _OpError
    if call.flags & (PFB_CALL_TENSORS | PFB_CALL_GRADIENT):
        return False
    if call.key_len != _EAGER_KEY_LEN or memcmp(call.key, _EAGER_KEY_C, call.key_len) != 0:
        return False
    if not isinstance(exc, Exception):
        return True
    if _OpError is None:
        from tensorflow.python.framework.errors_impl import OpError
        _OpError = OpError
    return isinstance(exc, _OpError)


def take_raised():
    """The exception the last failed eager call on this thread left to be
    re-raised as it is (see _raised_as_is), or None; clears it."""
    exc = getattr(_eager, "raised", None)
    _eager.raised = None
    return exc


cdef int32_t _bridge_call(PfbCall* call, PfbStatus* status) noexcept:
    status.code = 0
    status.message = NULL
    try:
        _run(call)
    except BaseException as exc:
        _set_status(status, exc)
        try:
            if _raised_as_is(call, exc):
                _eager.raised = exc  # taken by the eager caller on this thread
        except BaseException:
            pass  # the status alone then reports the error
    return status.code


cdef PfbBridgeApi _api
_api.abi_version = PFB_BRIDGE_ABI_VERSION
_api.call = _bridge_call
_bridge_api = PyCapsule_New(&_api, PFB_BRIDGE_CAPSULE, NULL)
