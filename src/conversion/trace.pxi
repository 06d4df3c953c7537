# TF's profiler: each bridge call puts its function on TF's trace, on the
# thread that ran it (TSL TraceMe events, through the kernel's PfbTraceApi,
# bridge_abi.h), whichever path it took: a kernel's call or call_eagerly.
#
#   module.qualname            the call, with its bytes, copies, node and API
#     pfb.inputs               converting the inputs (from entering the bridge)
#     pfb.function             the Python function itself
#       pfb.queue              executor=: the request waits for a worker,
#       pfb.worker             which runs the call,
#       pfb.reply              and its reply comes back
#     pfb.outputs              converting the results
#
# While no profiler session runs a call costs one relaxed atomic load (TSL's
# trace level, TraceMe's own check) and a few branches, and allocates nothing:
# the events are built, from times taken on TraceMe's clock, when it ends.

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL


cdef int _NO_TRACE_LEVEL = 0
# TSL's trace level once set_trace_api has run; until then a level that never
# records, so that the check needs no second test.
cdef const int* _trace_level = &_NO_TRACE_LEVEL
cdef const PfbTraceApi* _trace_api = NULL


def set_trace_api(uintptr_t address):
    """Installs the kernel's PfbTraceApi table (the address the kernel
    library's PyfuncBridge_TraceApi returns); the op layer calls it when it
    loads this module (pyfunc_bridge/_library.py)."""
    global _trace_api, _trace_level
    cdef const PfbTraceApi* api = <const PfbTraceApi*>address
    if api == NULL:
        raise ValueError("pyfunc_bridge: set_trace_api needs the kernel's table, got NULL")
    if api.abi_version != PFB_BRIDGE_ABI_VERSION:
        raise ImportError(
            f"pyfunc_bridge: the kernel library and the conversion module come from "
            f"different builds (trace table ABI {api.abi_version}, conversion module "
            f"{PFB_BRIDGE_ABI_VERSION}); reinstall pyfunc_bridge")
    _trace_api = api
    _trace_level = api.level


def tracing():
    """Whether a TF profiler session records the bridge's events now."""
    return pfb_trace_level(_trace_level) >= PFB_TRACE_FUNCTION


cdef struct _CallTrace:
    # TraceMe's clock (ns); 0: not reached.
    int64_t start       # _run entered
    int64_t called      # the function is called
    int64_t returned    # the function returned
    int64_t exported    # the outputs are made
    # The call's counts (_CallCounts) when the function was called: the
    # inputs' share; the outputs' is the rest.
    int64_t in_zero_copy
    int64_t in_copied[_NUM_REASONS]


cdef inline _CallTrace* _trace_begin(_CallTrace* trace) noexcept:
    """Stamps the start; NULL while no profiler session records (the one
    relaxed atomic load a call costs then)."""
    if pfb_trace_level(_trace_level) < PFB_TRACE_FUNCTION:
        return NULL
    memset(trace, 0, sizeof(_CallTrace))
    trace.start = _trace_api.now()
    return trace


cdef inline int64_t _trace_now() noexcept:
    return _trace_api.now()


cdef int _trace_called(_CallTrace* trace, _CallCounts* counts) noexcept:
    """The function is about to be called: the inputs' bytes are counted."""
    trace.in_zero_copy = counts.zero_copy
    memcpy(trace.in_copied, counts.copied, sizeof(trace.in_copied))
    trace.called = _trace_api.now()
    return 0


cdef str _trace_text(object value):
    """`value` as a TraceMe metadata value or name: no ',' or '#' (TraceMe's
    separators; TF's parser would cut the value there)."""
    return str(value).replace(",", ";").replace("#", "_")


cdef int _record(str event, int64_t start, int64_t end, int32_t level) except -1:
    """One complete event on this thread; `event`: TraceMe's encoding."""
    cdef Py_ssize_t size
    cdef const char* text = PyUnicode_AsUTF8AndSize(event, &size)  # the str's own UTF-8
    _trace_api.record(text, size, start, end, level)
    return 0


cdef str _copies_text(const int64_t* copied):
    """The metadata of bytes copied, after their total: per reason, and the
    reasons ("" when nothing was copied)."""
    cdef int i
    reasons = None
    text = ""
    for i in range(_NUM_REASONS):
        if copied[i]:
            text += f",bytes_copied_{COPY_REASONS[i]}={copied[i]}"
            reasons = COPY_REASONS[i] if reasons is None else f"{reasons} {COPY_REASONS[i]}"
    return text if reasons is None else f"{text},copy_reasons={reasons}"


cdef str _bytes_text(int64_t zero_copy, const int64_t* copied, int64_t* total):
    """The metadata of some bytes as the statistics count them: in all, handed
    over without a copy, copied (in all, and _copies_text); `total`: set to
    the bytes in all."""
    cdef int64_t copies = 0
    cdef int i
    for i in range(_NUM_REASONS):
        copies += copied[i]
    total[0] = zero_copy + copies
    return (f"bytes={zero_copy + copies},bytes_zero_copy={zero_copy},bytes_copied={copies}"
            + _copies_text(copied))


cdef str _traced_name(object func):
    """The function's event name: module.qualname."""
    module = getattr(func, "__module__", None) or type(func).__module__
    return _trace_text(f"{module}.{_qualname(func)}")


cdef str _trace_api_name(PfbCall* call, object entry):
    """The public function that built the op: the entry's `api`, else what
    the call and the entry say (an op from elsewhere, py_function)."""
    if call.flags & PFB_CALL_GRADIENT:
        return "py_function_gradient"
    if call.flags & PFB_CALL_TENSORS:
        return "py_function"
    api = getattr(entry, "api", None)
    if api:
        return api
    if getattr(entry, "framework", None) is not None:
        return "array_function"
    return "numpy_function"


cdef str _trace_head(PfbCall* call, object entry, _Converter conv):
    """The function's event up to its per-call metadata: "name#api=...,"
    with the node, the statistics' name, the framework and the pool."""
    if call.flags & PFB_CALL_GRADIENT:
        forward = (<_Forward>entry).name if isinstance(entry, _Forward) else None
        head = f"{forward or 'py_function'} (gradient)#"  # its forward call's, if traced
    else:
        head = _traced_name(entry.func) + "#"
    head += f"api={_trace_api_name(call, entry)},"
    if call.node_name != NULL and call.node_name_len:
        node = call.node_name[:call.node_name_len].decode("utf-8", "replace")
        head += f"node={_trace_text(node)},"
    elif getattr(entry, "name", None) and not (call.flags & PFB_CALL_GRADIENT):
        head += f"node={_trace_text(entry.name)},"  # an eager call's name=
    if not (call.flags & PFB_CALL_GRADIENT):
        head += f"stats_name={_trace_text(_display_name(entry))},"
    framework = getattr(entry, "framework", None)
    if framework is not None:
        head += f"framework={_trace_text(framework.name)},"
    if isinstance(conv, _ProcessConverter):
        pool = getattr((<_ProcessConverter>conv).pool, "name", "process")
        head += f"executor={_trace_text(pool)},"
    return head


cdef int _trace_end(_CallTrace* trace, PfbCall* call, object entry, _Converter conv,
                    _Site site, _CallCounts* counts, object failure) noexcept:
    """Records the call's events (the end of _run: after the context is left,
    or, for a failed call, before).  `site`: the kernel's, which keeps the
    function event's head;
    `failure`: the type of the exception that failed the call, or None.
    Never raises: a profile that cannot be recorded must not fail the call."""
    cdef int64_t end = _trace_api.now()
    cdef int64_t out_zero_copy, bytes_in, bytes_out
    cdef int64_t out_copied[_NUM_REASONS]
    cdef int64_t copied[_NUM_REASONS]
    cdef int i
    try:
        if site is None:
            head = _trace_head(call, entry, conv)
        else:
            if site.trace_head is None:
                site.trace_head = _trace_head(call, entry, conv)
            head = site.trace_head
        if call.flags & PFB_CALL_RECORD and call.state != NULL:
            # The gradient's event names the function of its forward call.
            (<_Forward>call.state).name = head[:head.index("#")]
        if trace.called == 0:  # failed before the function: all inputs
            trace.in_zero_copy = counts.zero_copy
            memcpy(trace.in_copied, counts.copied, sizeof(trace.in_copied))
        out_zero_copy = counts.zero_copy - trace.in_zero_copy
        for i in range(_NUM_REASONS):
            out_copied[i] = counts.copied[i] - trace.in_copied[i]
            copied[i] = counts.copied[i]
        inputs = _bytes_text(trace.in_zero_copy, trace.in_copied, &bytes_in)
        outputs = _bytes_text(out_zero_copy, out_copied, &bytes_out)
        call_text = (f"{head}bytes_in={bytes_in},bytes_out={bytes_out},"
                     f"bytes_zero_copy={counts.zero_copy},"
                     f"bytes_copied={bytes_in + bytes_out - counts.zero_copy}"
                     + _copies_text(copied))
        if failure is not None:
            call_text += f",error={_trace_text(failure.__name__)}"
        _record(call_text + "#", trace.start, end, PFB_TRACE_FUNCTION)
        # The steps, each from the end of the one before.
        _record(f"pfb.inputs#{inputs}#", trace.start, trace.called or end, PFB_TRACE_DETAIL)
        if trace.called:
            _record("pfb.function", trace.called, trace.returned or end, PFB_TRACE_DETAIL)
        if trace.returned:
            _record(f"pfb.outputs#{outputs}#", trace.returned, trace.exported or end,
                    PFB_TRACE_DETAIL)
    except BaseException:
        pass  # the call's own outcome stands
    return 0


def trace_now():
    """TraceMe's clock (ns since the epoch, CLOCK_REALTIME: time.time_ns()
    in any process) while a profiler session records; 0 otherwise."""
    if pfb_trace_level(_trace_level) < PFB_TRACE_FUNCTION:
        return 0
    return _trace_api.now()


def trace_worker(int64_t queued, int64_t started, int64_t ended, object pid):
    """Records a call run by a worker process, on this (the calling) thread
    as its reply wakes it, inside the call's pfb.function event: pfb.queue
    from `queued` (the request was queued, trace_now()) to `started`,
    pfb.worker from `started` to `ended` (the worker's time.time_ns() around
    its work on the call) in worker process `pid`, and pfb.reply from then to
    now."""
    if queued <= 0 or pfb_trace_level(_trace_level) < PFB_TRACE_DETAIL:
        return
    cdef int64_t woke = _trace_api.now()
    # One clock in both processes; in order, whatever a clock step did.
    started = min(max(started, queued), woke)
    ended = min(max(ended, started), woke)
    _record("pfb.queue", queued, started, PFB_TRACE_DETAIL)
    _record(f"pfb.worker#pid={pid}#", started, ended, PFB_TRACE_DETAIL)
    _record("pfb.reply", ended, woke, PFB_TRACE_DETAIL)
