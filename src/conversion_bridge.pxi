# The entry point the kernel calls, the function registry it reads, and the
# capsule that publishes both to the kernel.

# key -> weakref to an entry with a `.func`; written by the op layer
# (pyfunc_bridge/_registry.py), which keeps each entry alive with its graphs.
cdef dict _functions = {}
# Eagerly executed ops run their kernel on the calling thread: the op layer
# puts the function here for the duration of the call.
_eager = threading.local()
EAGER_KEY = "pyfunc_bridge:eager"


def registry():
    """The dict the bridge resolves keys in (key -> weakref of an entry)."""
    return _functions


cdef object _lookup(str key):
    if key == EAGER_KEY:
        entry = getattr(_eager, "entry", None)
    else:
        ref = _functions.get(key)
        entry = ref() if ref is not None else None
    if entry is None:
        raise ValueError(
            f"pyfunc_bridge: no Python function is registered under key {key!r}. "
            f"Functions live as long as the graphs or tf.functions that created "
            f"them; keep that graph or function alive while its ops run")
    return entry


cdef int _run(PfbCall* call) except -1:
    cdef int i, n_in = call.num_inputs, n_out = call.num_outputs
    cdef bint writable = call.copy_mode == PFB_COPY_TRUE
    # Adopt every input first: from here on, each is freed on every path.
    owners = []
    try:
        for i in range(n_in):
            owners.append(_adopt(call.inputs[i]))
    except BaseException:
        for i in range(len(owners), n_in):
            call.inputs[i].deleter(call.inputs[i])
        raise
    key = call.key[:call.key_len].decode("utf-8")
    entry = _lookup(key)

    previous_handler = cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
    try:
        args = []
        for i in range(n_in):
            view = _view(owners[i], False)
            if writable and isinstance(view, np.ndarray) and view.dtype != _OBJECT:
                view = np.array(view, copy=True)  # private and writable
            args.append(view)
        owners = view = None
        result = entry.func(*args)
        args = None  # the inputs are no longer ours
        values = _result_values(result, n_out)
        result = None  # each value is now referenced once by `values`, unless shared
        for i in range(n_out):
            call.outputs[i] = _export_output(values, i, &call.output_specs[i], call.copy_mode)
    except BaseException:
        for i in range(n_out):
            if call.outputs[i] != NULL:
                _release_exported(call.outputs[i])
                call.outputs[i] = NULL
        raise
    finally:
        cnp.PyDataMem_SetHandler(previous_handler)
    return 0


cdef int32_t _bridge_call(PfbCall* call, PfbStatus* status) noexcept:
    status.code = 0
    status.message = NULL
    try:
        _run(call)
    except BaseException as exc:
        _set_status(status, exc)
    return status.code


cdef PfbBridgeApi _api
_api.abi_version = PFB_BRIDGE_ABI_VERSION
_api.call = _bridge_call
_bridge_api = PyCapsule_New(&_api, PFB_BRIDGE_CAPSULE, NULL)
