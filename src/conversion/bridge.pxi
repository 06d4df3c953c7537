# The one call driver (_run), the entry point the kernel calls, the function
# registry it reads, and the capsule that publishes the entry point.

# key -> weakref to an entry with a `.func`; written by the op layer
# (pyfunc_bridge/_registry.py), which keeps each entry alive with its graphs.
cdef dict _functions = {}
# An eager op's kernel may run on another thread than its caller (TF runs
# GPU kernels on its own threads), so each calling thread has a slot of its
# own, found by the key its eager ops carry; TF's eager kernel cache then
# grows with the threads, not with the calls.
EAGER_KEY = "pyfunc_bridge:eager"
cdef bytes _EAGER_PREFIX = (EAGER_KEY + ":").encode()
cdef const char* _EAGER_PREFIX_C = _EAGER_PREFIX
cdef size_t _EAGER_PREFIX_LEN = len(_EAGER_PREFIX)
_eager = threading.local()  # .slot: this thread's _EagerSlot
cdef dict _eager_slots = {}  # key bytes -> weakref of the slot of a live thread


cdef class _EagerSlot:
    """One thread's eager calls: the entry the op layer put there for the call
    under way, and what a failed call left to re-raise (take_raised)."""
    cdef readonly str key
    cdef bytes key_bytes  # what call.key points into (eager.pxi)
    cdef public object entry
    cdef public object raised
    cdef object __weakref__

    def __cinit__(self, str key):
        self.key = key
        self.key_bytes = key.encode()
        self.entry = None
        self.raised = None


def eager_slot():
    """This thread's eager slot (its `.key` is what its eager ops carry)."""
    try:
        return _eager.slot
    except AttributeError:
        slot = _EagerSlot(f"{EAGER_KEY}:{threading.get_ident()}")
        # A dead thread's slot goes with its thread-local data; its ident may
        # come back with a new thread, whose slot then replaces it here.
        _eager_slots[slot.key_bytes] = weakref.ref(slot)
        _eager.slot = slot
        return slot


cdef inline bint _is_eager_key(PfbCall* call) noexcept:
    """Whether `call` runs under an eager key (an eager call made by the op
    layer, through an eager op's kernel or call_eagerly)."""
    return (call.key_len > _EAGER_PREFIX_LEN
            and memcmp(call.key, _EAGER_PREFIX_C, _EAGER_PREFIX_LEN) == 0)


cdef _EagerSlot _slot_of(PfbCall* call):
    """The slot of the thread that made the eager call `call`, or None."""
    ref = _eager_slots.get(call.key[:call.key_len])
    return ref() if ref is not None else None


def registry():
    """The dict the bridge resolves keys in (key -> weakref of an entry)."""
    return _functions


cdef object _lookup(PfbCall* call):
    if _is_eager_key(call):
        slot = _slot_of(call)
        entry = slot.entry if slot is not None else None
        if entry is None:
            raise ValueError(
                f"pyfunc_bridge: no Python function is registered under key "
                f"{_attr_bytes(call.key, call.key_len).decode('utf-8', 'replace')!r}: "
                f"this key is for eager calls made by pyfunc_bridge "
                f"itself; build the op with pfb.numpy_function/py_function")
        return entry
    ref = _functions.get(call.key[:call.key_len].decode("utf-8"))
    entry = ref() if ref is not None else None
    if entry is None:
        return _resolve_missing(call)
    return entry


cdef object _resolve = None  # pyfunc_bridge._resolve.resolve, on the first miss


cdef bytes _attr_bytes(const char* data, size_t size):
    return data[:size] if size != 0 else b""


cdef object _resolve_missing(PfbCall* call):
    """A key this process did not register (a graph from elsewhere, or a
    dropped source graph): the op's portable description may name the
    function.  Resolved once per key; later calls find it in `_functions`."""
    global _resolve
    if _resolve is None:
        from pyfunc_bridge._resolve import resolve
        _resolve = resolve
    return _resolve(
        _attr_bytes(call.key, call.key_len).decode("utf-8", "replace"),
        _attr_bytes(call.reference, call.reference_len).decode("utf-8", "replace"),
        _attr_bytes(call.pickled, call.pickled_len),
        _attr_bytes(call.framework, call.framework_len).decode("utf-8", "replace"),
        bool(call.flags & PFB_CALL_TENSORS), call.num_outputs)


cdef class _Site:
    """What a kernel's key resolved to, cached in the kernel (PfbCall.site) so
    that its later calls skip the registry: the entry, held weakly (its graphs
    keep it alive, the kernel must not), the converter and the statistics
    record.  Read and written with the GIL held only."""
    cdef object ref              # weakref.ref of the entry
    cdef _Converter converter
    cdef _FunctionStats record   # None until the first counted call
    cdef str trace_head          # None until the first traced call (trace.pxi)


cdef _Site _site(PfbCall* call):
    """The kernel's site, its entry alive (refreshed when it has gone); None
    for calls that have no slot (call_eagerly), that run no entry
    (gradients), or that run under the eager key (an eager op's kernel: the
    key names the thread's entry of the moment, a new one every call, and a
    cached one still alive, an outer call's, would run in a nested call's
    place): those resolve the entry every call (_entry)."""
    if call.site == NULL or call.flags & PFB_CALL_GRADIENT or _is_eager_key(call):
        return None
    cdef _Site site
    if call.site[0] != NULL:
        site = <_Site>call.site[0]
        if PyWeakref_GET_OBJECT(site.ref) != <PyObject*>None:
            return site
    entry = _lookup(call)
    site = _Site.__new__(_Site)
    try:
        site.ref = weakref.ref(entry)
    except TypeError:
        return None  # an entry not weakly referenceable is never cached
    site.converter = _converter(call, entry)
    Py_INCREF(site)  # the kernel's reference, released by the kernel or below
    Py_XDECREF(<PyObject*>call.site[0])
    call.site[0] = <void*>site
    return site


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


cdef object _entry(PfbCall* call):
    """What the call runs: the registered entry, or for a gradient call the
    recorded forward state (PfbCall.state, borrowed)."""
    if call.flags & PFB_CALL_GRADIENT:
        return <object>call.state
    return _lookup(call)


cdef _Converter _converter(PfbCall* call, object entry):
    """The py_function kernels' calls (PFB_CALL_TENSORS, gradients included)
    take EagerTensors; every other call its entry's converter (NumPy, or a
    framework adapter's)."""
    if call.flags & (PFB_CALL_TENSORS | PFB_CALL_GRADIENT):
        return _TENSORS
    return <_Converter?>entry.converter  # checked: a foreign entry fails cleanly


cdef int _delete_outputs(PfbCall* call) noexcept:
    """Frees the outputs made so far (each by its own deleter: outputs may be
    foreign tensors)."""
    cdef int i
    for i in range(call.num_outputs):
        if call.outputs[i] != NULL:
            call.outputs[i].deleter(call.outputs[i])
            call.outputs[i] = NULL
    return 0


cdef int _run(PfbCall* call) except -1:
    """The one call driver: every bridge call, from any kernel or from
    call_eagerly, runs these steps; its converter does the kind-specific part."""
    cdef _CallCounts counts
    cdef _CallTrace trace
    # NULL unless a profiler session records (one relaxed atomic load).
    cdef _CallTrace* tracing = _trace_begin(&trace)
    # A gradient call runs no function of the user's: it is not counted (a
    # traced one counts its bytes for its events only).
    cdef bint counted = _stats_on and not (call.flags & PFB_CALL_GRADIENT)
    cdef _CallCounts* counting = _stats_begin(&counts, counted or tracing != NULL)
    cdef _Converter conv
    cdef _FunctionStats record = None
    args = _adopt_inputs(call)
    cdef _Site site = _site(call)
    if site is not None:
        entry = <object>PyWeakref_GET_OBJECT(site.ref)  # alive: _site checked it
        conv = site.converter
    else:
        entry = _entry(call)
        conv = _converter(call, entry)
    if counted:
        if site is None:
            record = _record_of(entry)
        else:
            if site.record is None:
                site.record = _record_of(entry)
            record = site.record
    entered = None
    try:
        # The context first: py_function's inputs are made in it (eager mode:
        # on a TF1 Session's worker thread a string input would otherwise
        # become a graph constant).
        entered = conv.enter(call)
        ranges = conv.inputs(call, args, counting)
        if counting != NULL:
            counting.called = _now()
            if tracing != NULL:
                _trace_called(tracing, counting)
        result = conv.call(call, entry, args, counting)
        if counting != NULL:
            counting.returned = _now()
            if tracing != NULL:
                tracing.returned = _trace_now()
        args = None  # the inputs are no longer ours
        # `result` is our only reference: the rest belong to someone else.
        conv.outputs(call, result, Py_REFCNT(<PyObject*>result) - 1, ranges, counting)
        if tracing != NULL:
            tracing.exported = _trace_now()
    except BaseException as exc:
        _delete_outputs(call)
        if counted:
            _stats_end(counting, record, True)
        if tracing != NULL:
            _trace_end(tracing, call, entry, conv, site, counting, type(exc))
        raise
    finally:
        conv.leave(call, entered)
    if tracing != NULL:
        _trace_end(tracing, call, entry, conv, site, counting, None)
    if counted:
        _stats_end(counting, record, False)
    return 0


cdef tuple _failure(PfbCall* call, object exc):
    """(TF error code, message) of the exception that failed `call`, for its
    status; never raises.  Both eager paths (an eager op's kernel, and
    call_eagerly) run under the eager key: for such a call this also leaves
    on the thread what the op layer raises in place of the status's TF error
    (take_raised): _eager_raised's answer."""
    status = _status_of(exc)
    if _is_eager_key(call):
        try:
            slot = _slot_of(call)
            if slot is not None:
                slot.raised = None
                slot.raised = _eager_raised(call, exc, status[0], status[1])
        except BaseException:
            pass  # the status alone then reports the error
    return status


def take_raised():
    """The exception the last failed eager call made by this thread left to be
    raised in place of its TF error (see _failure), or None; clears it.  The op layer's
    eager calls (pyfunc_bridge/_op.py, run_eagerly) raise it in place of the
    TF error, whichever path the call took."""
    slot = eager_slot()
    exc, slot.raised = slot.raised, None
    return exc


cdef int32_t _bridge_call(PfbCall* call, PfbStatus* status) noexcept:
    status.code = 0
    status.message = NULL
    try:
        _run(call)
    except BaseException as exc:
        code, message = _failure(call, exc)
        _set_status(status, code, message)
    return status.code


cdef PfbBridgeApi _api
_api.abi_version = PFB_BRIDGE_ABI_VERSION
_api.call = _bridge_call
_bridge_api = PyCapsule_New(&_api, PFB_BRIDGE_CAPSULE, NULL)
