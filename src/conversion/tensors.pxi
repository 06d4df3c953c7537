# py_function calls: the EagerTensor converter (the kernel's TF tensors <->
# EagerTensors through its PfbEagerApi, else DLPack through the TF exports of
# tf.pxi), the forward state that pairs each call with its gradient, and the
# eager mode and device scope the function runs in.

cdef extern from "Python.h":
    PyObject* PyErr_Occurred()


cdef int _raise_pending() except -1:
    return -1  # the exception Python already set propagates


cdef object _kernel_tensor(const PfbEagerApi* eager, _DLPackOwner owner, Py_ssize_t i):
    """The kernel's EagerTensor over input `i`'s TF tensor (no DLPack)."""
    cdef PyObject* made = <PyObject*>eager.to_eager(owner.managed)
    if made == NULL:
        if PyErr_Occurred() != NULL:
            _raise_pending()
        raise RuntimeError(
            f"pyfunc_bridge: TensorFlow could not make an EagerTensor of input {i}")
    tensor = <object>made  # a second reference: drop the one we were given
    Py_XDECREF(made)
    return tensor


cdef int _input_tensors(PfbCall* call, tuple args, _CallCounts* counts) except -1:
    """Swaps each input owner for an EagerTensor viewing TF's memory (strings:
    converted; unaligned memory: copied, as the copy decision says).  Host
    memory that is shared becomes the kernel's EagerTensor where the kernel
    has them (call.eager), else one made from DLPack."""
    cdef Py_ssize_t i
    cdef _DLPackOwner owner
    cdef DLTensor* t
    for i in range(len(args)):
        owner = <_DLPackOwner>args[i]
        t = &owner.managed.dl_tensor
        if _is_string_dtype(t.dtype):
            strings = _view(owner, False)
            if counts != NULL:
                _count_input(counts, strings, &counts.zero_copy)  # an object array: strings
            _swap(args, i, _tf_constant(strings))
            continue
        # TF's kernels assume aligned memory (an unaligned slice of a TF
        # buffer can reach us); device memory is TF's own allocation.
        reason = _copy_reason(
            PFB_COPY_NONE, False, False, True,
            t.device.device_type != kDLCPU or _aligned(<char*>t.data + t.byte_offset))
        if counts != NULL:
            _count_bytes(counts, reason, _nbytes(t))
        if reason is not None:
            owner = _adopt_checked(_private_copy(owner))
        elif call.eager != NULL and t.device.device_type == kDLCPU:
            _swap(args, i, _kernel_tensor(call.eager, owner, i))
            continue
        _swap(args, i, _tf_tensor(owner))
    return 0


cdef class _Forward:
    """What a py_function call recorded for its gradient: the tape over the
    function's TF computation, its floating inputs and outputs."""
    cdef readonly object tape
    cdef readonly tuple sources
    # One per floating output (as declared): the tensor the function returned,
    # or None where it returned something TF did not compute (an ndarray).
    cdef readonly list targets
    # The event name of the forward call (trace.pxi), for its gradient's
    # event; None when no profiler traced it.
    cdef object name

    def __repr__(self):
        return (f"<pyfunc_bridge forward state: {len(self.sources)} sources, "
                f"{len(self.targets)} targets>")

    cdef list gradient(self, tuple grads):
        """The input gradients, from one gradient per floating output (those
        of outputs TF did not compute contribute nothing)."""
        if len(grads) != len(self.targets):
            raise ValueError(
                f"pyfunc_bridge: the py_function gradient got {len(grads)} output "
                f"gradients for {len(self.targets)} floating outputs")
        pairs = [(t, g) for t, g in zip(self.targets, grads) if t is not None]
        if self.sources and pairs:
            results = self.tape.gradient([t for t, _ in pairs], self.sources,
                                         output_gradients=[g for _, g in pairs],
                                         unconnected_gradients=_unconnected_zero)
            # Sparse gradients (tf.gather) become dense tensors.
            return [r if _is_eager_tensor(r) else _tf_convert(r) for r in results]
        return [_tf_zeros(s.shape, s.dtype) for s in self.sources]


cdef bint _differentiable(object tensor):
    return tensor.dtype.is_floating or tensor.dtype.is_complex


cdef inline bint _floating_spec(const PfbOutputSpec* spec):
    return spec.dtype.code in (kDLFloat, kDLBfloat, kDLComplex)


cdef int _export_results(PfbCall* call, object results, _CallCounts* counts) except -1:
    """A py_function wrapper's flat result list -> the call's outputs.

    EagerTensors are TF's immutable memory: handed over without a copy (in
    host memory, the kernel's own TF tensor where it has call.eager).  The
    list holds other results too, so NumPy arrays count as referenced
    elsewhere and are copied; one of another dtype is converted where no
    value changes (_converted, outputs.pxi)."""
    cdef int i
    cdef const PfbOutputSpec* spec
    cdef DLManagedTensorVersioned* m
    if len(results) != call.num_outputs:
        _check_count(results, call.num_outputs, _ONE_TENSOR)
    for i in range(call.num_outputs):
        value = results[i]
        spec = &call.output_specs[i]
        if _is_string_dtype(spec.dtype):
            if _is_eager_tensor(value):
                value = value.numpy()  # strings are converted anyway
        elif call.eager != NULL and spec.device.device_type == kDLCPU:
            m = call.eager.from_eager(<void*>value)
            if m != NULL:
                call.outputs[i] = _export_owner(_adopt_checked(m), value, i, spec,
                                                PFB_COPY_NONE, False, False, None, counts)
                continue
        try:
            # NumPy results of another dtype convert where no value changes;
            # EagerTensors do not (TF's convert_to_tensor refuses them too).
            call.outputs[i] = _export_dlpack_output(<PyObject*>value, 1, i,
                                                    &call.output_specs[i],
                                                    PFB_COPY_NONE, [], counts, call.stream,
                                                    True)
        except _UnsupportedOutput as exc:
            # TF's py_function reports a result without a tensor form as
            # InvalidArgument (its numpy_function: INTERNAL).
            raise _OutputError(*exc.args) from None
    return 0


# TF's worker threads run nothing but kernels: the device scope a py_function
# needs stays entered there (re-entered when the device changes); on Python's
# own threads it is entered and left around every call.  Eager mode (needed in
# TF1 programs, whose threads start in graph mode) is entered and left around
# every call on every thread: TF's eager_mode() is a generator, and one left
# suspended in a thread-local would be closed when that thread's state is
# cleared, at exit and on another thread, popping that thread's stack of TF
# context switches ("IndexError: pop from empty list" at exit).
_worker_scopes = threading.local()


cdef inline bint _eager_now(object ctx) except -1:
    """ctx.executing_eagerly(), without its Python frame: the thread's flag."""
    return ctx._thread_local_data.is_eager


cdef tuple _own_sync_executor(object ctx):
    """Gives this thread a synchronous executor for one call, as TF's
    EagerPyFunc kernel does: the thread's async executor may be the one running
    this kernel, and the function's ops queued behind it would wait for ever.
    Returns (the thread's executor, the new one) for _restore_executor, or None
    where the thread's executor is synchronous."""
    handle = ctx._context_handle
    previous = _tfe.TFE_ContextGetExecutorForThread(handle)
    if not _tfe.TFE_ExecutorIsAsync(previous):
        _tfe.TFE_DeleteExecutor(previous)  # only the wrapper: the executor is the context's
        return None
    own = _tfe.TFE_NewExecutor(False, True, 0)
    _tfe.TFE_ContextSetExecutorForThread(handle, own)
    return previous, own


cdef int _restore_executor(object ctx, tuple executors) except -1:
    previous, own = executors
    _tfe.TFE_ContextSetExecutorForThread(ctx._context_handle, previous)
    _tfe.TFE_DeleteExecutor(previous)
    _tfe.TFE_DeleteExecutor(own)  # synchronous: nothing of it is pending
    return 0


cdef class _Scopes:
    """Eager mode plus the op's device (and a synchronous executor where the
    thread's is async), entered for one py_function call."""
    cdef list entered
    cdef object eager  # the entered eager_mode(), left at the end of the call
    cdef bint persistent
    cdef bytes device  # the op device it entered
    cdef tuple executors  # _own_sync_executor's, restored at the end of the call
    cdef object ctx

    def __cinit__(self):
        self.entered = []

    cdef bint holds(self, const char* device_name):
        """Whether this scope is on `device_name` (NULL: none), as entered."""
        if self.device is None or device_name == NULL:
            return self.device is None and device_name == NULL
        return strcmp(<const char*>self.device, device_name) == 0

    cdef int enter(self, PfbCall* call, object ctx) except -1:
        if not _eager_now(ctx):
            manager = _eager_mode()
            manager.__enter__()
            self.eager = manager
        self.persistent = call.flags & PFB_CALL_WORKER_THREAD
        name = call.device_name if call.device_name != NULL else None  # bytes
        if self.persistent:
            installed = getattr(_worker_scopes, "scopes", None)
            if installed is not None and (<_Scopes>installed).holds(call.device_name):
                return 0
            if installed is not None:
                (<_Scopes>installed).exit()
            _worker_scopes.scopes = self
        self.device = name
        if name is not None and not name.endswith(_sole_device(ctx)):
            text = name.decode()
            if ctx.device_name != text:
                self._enter(ctx.device(text))
        return 0

    cdef int _enter(self, manager) except -1:
        manager.__enter__()
        self.entered.append(manager)
        return 0

    cdef int exit(self) except -1:
        while self.entered:
            self.entered.pop().__exit__(None, None, None)
        return 0

    cdef int leave(self) except -1:
        """The end of one call: only Python's threads leave the device scope."""
        try:
            if not self.persistent:
                self.exit()
            if self.eager is not None:
                manager, self.eager = self.eager, None
                manager.__exit__(None, None, None)
        finally:  # (a scope the function left unbalanced raises above)
            if self.executors is not None:
                executors, self.executors = self.executors, None
                _restore_executor(self.ctx, executors)
        return 0


cdef class _TensorConverter(_Converter):
    """py_function: EagerTensors in, EagerTensors (or arrays) out, run in
    eager mode on the op's device; records the call for its gradient, and
    runs a gradient call (PFB_CALL_GRADIENT) from its recorded _Forward."""

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        _input_tensors(call, args, counts)
        return None

    cdef object enter(self, PfbCall* call):
        _load_tf()  # enter runs first (bridge.pxi, _run)
        ctx = _tf_context()
        # Only a context made async has async executors on the threads that run kernels.
        executors = _own_sync_executor(ctx) if ctx._default_is_async else None
        if executors is None and call.flags & PFB_CALL_WORKER_THREAD and _eager_now(ctx):
            # TF's worker thread in eager mode, its device scope entered by an
            # earlier call (_Scopes.enter): nothing to enter, nothing to leave.
            installed = getattr(_worker_scopes, "scopes", None)
            if installed is not None and (<_Scopes>installed).holds(call.device_name):
                return None
        cdef _Scopes scopes = _Scopes()
        scopes.ctx = ctx
        scopes.executors = executors
        try:
            scopes.enter(call, ctx)
        except BaseException:
            scopes.leave()
            raise
        return scopes

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        if call.flags & PFB_CALL_GRADIENT:
            return (<_Forward>entry).gradient(args)
        # Eager kernels always see their outputs required: the op layer knows
        # whether a tape watches the call.
        if not ((call.flags & PFB_CALL_RECORD) and entry.record):
            return entry.func(*args)
        tape = _GradientTape(persistent=True)
        # A thread whose tapes TF stopped (a tf.function's caller runs its
        # body so, and an XLA custom call runs there) records nothing: this
        # call's own tape records anyway, for the duration of the function.
        stopped = _tfe.TFE_Py_TapeSetIsStopped()
        if stopped:
            _tfe.TFE_Py_TapeSetRestartOnThread()
        tape.__enter__()
        try:
            sources = tuple([a for a in args if _differentiable(a)])
            tape.watch(sources)
            results = entry.func(*args)
        finally:
            tape.__exit__(None, None, None)
            if stopped:
                _tfe.TFE_Py_TapeSetStopOnThread()
        if len(results) != call.num_outputs:
            _check_count(results, call.num_outputs, _ONE_TENSOR)
        cdef _Forward forward = _Forward.__new__(_Forward)
        forward.tape = tape
        forward.sources = sources
        forward.targets = [
            results[i] if _is_eager_tensor(results[i]) else None
            for i in range(call.num_outputs) if _floating_spec(&call.output_specs[i])]
        # A new reference that PfbCall.state hands to the kernel, which owns
        # it from here on, also when exporting the outputs fails.
        Py_INCREF(forward)
        call.state = <void*>forward
        return results

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        return _export_results(call, result, counts)

    cdef int leave(self, PfbCall* call, object entered) except -1:
        if entered is not None:
            (<_Scopes>entered).leave()
        return 0


cdef _TensorConverter _TENSORS = _TensorConverter()
