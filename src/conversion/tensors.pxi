# py_function calls: DLPack <-> EagerTensors (through the DLPack layer's TF
# import and export, dlpack_export.pxi), and the forward state that
# pairs each call with its gradient.  TensorFlow's modules are looked up on the
# first such call.

cdef object _GradientTape = None
cdef object _tf_constant = None
cdef object _tf_zeros = None
cdef object _tf_convert = None
cdef object _unconnected_zero = None
cdef object _eager_mode = None


cdef int _import_tensorflow() except -1:
    global _GradientTape, _tf_constant, _tf_zeros, _tf_convert, _unconnected_zero
    global _eager_mode
    if _GradientTape is not None:
        return 0
    _load_tf()
    import tensorflow as tf
    from tensorflow.python.eager import context
    _eager_mode = context.eager_mode
    _tf_constant = tf.constant
    _tf_zeros = tf.zeros
    _tf_convert = tf.convert_to_tensor
    _unconnected_zero = tf.UnconnectedGradients.ZERO
    _GradientTape = tf.GradientTape
    return 0


cdef tuple _input_tensors(PfbCall* call, _CallCounts* counts):
    """One EagerTensor per input, viewing TF's memory (strings: converted)."""
    args = _adopt_inputs(call)  # each owner frees its input on every path
    cdef list tensors = []
    cdef _DLPackOwner owner
    cdef DLTensor* t
    for owner in args:
        t = &owner.managed.dl_tensor
        if _is_string_dtype(t.dtype):
            strings = _view(owner, False)
            if counts != NULL:
                counts.copied[_STRING] += sum([len(b) for b in strings.flat])
            tensors.append(_tf_constant(strings))
            continue
        aligned = (t.device.device_type != kDLCPU
                   or (<uintptr_t>t.data + t.byte_offset) % ALIGNMENT == 0)
        if counts != NULL:
            _count_bytes(counts, None if aligned else "unaligned", _nbytes(t))
        if aligned:
            tensors.append(_tf_tensor(owner))
        else:
            # TF's kernels assume aligned memory (an unaligned slice of a TF
            # buffer can reach us): such an input gets an aligned copy.
            tensors.append(_tf_tensor(_adopt_checked(_private_copy(owner))))
    return tuple(tensors)


cdef class _Forward:
    """What a py_function call recorded for its gradient: the tape over the
    function's TF computation, its floating inputs and outputs."""
    cdef readonly object tape
    cdef readonly tuple sources
    # One per floating output (as declared): the tensor the function returned,
    # or None where it returned something TF did not compute (an ndarray).
    cdef readonly list targets

    def __repr__(self):
        return (f"<pyfunc_bridge forward state: {len(self.sources)} sources, "
                f"{len(self.targets)} targets>")


cdef bint _differentiable(object tensor):
    return tensor.dtype.is_floating or tensor.dtype.is_complex


cdef inline bint _floating_spec(const PfbOutputSpec* spec):
    return spec.dtype.code in (kDLFloat, kDLBfloat, kDLComplex)


cdef int _export_results(PfbCall* call, object results, _CallCounts* counts) except -1:
    """A py_function wrapper's flat result list -> the call's outputs.

    EagerTensors are TF's immutable memory: handed over without a copy.  The
    list holds other results too, so NumPy arrays count as referenced
    elsewhere and are copied."""
    cdef int i
    if len(results) != call.num_outputs:
        _check_count(results, call.num_outputs)
    for i in range(call.num_outputs):
        value = results[i]
        if _is_string_dtype(call.output_specs[i].dtype) and _is_eager_tensor(value):
            value = value.numpy()  # strings are converted anyway
        call.outputs[i] = _export_dlpack_output(<PyObject*>value, 1, i, &call.output_specs[i],
                                                PFB_COPY_NONE, [], counts)
    return 0


cdef object _sole_device_name = None


cdef bytes _sole_device(ctx):
    """The name (``/device:CPU:0``) of the process's only TF device, if it has
    just one: every TF op runs there, so no device scope is needed."""
    global _sole_device_name
    if _sole_device_name is None:
        devices = ctx.list_logical_devices()
        # b"\0" matches no device name.
        _sole_device_name = devices[0].name.encode() if len(devices) == 1 else b"\0"
    return _sole_device_name


# TF's worker threads run nothing but kernels: the device scope a py_function
# needs stays entered there (re-entered when the device changes); on Python's
# own threads it is entered and left around every call.  Eager mode (needed in
# TF1 programs, whose threads start in graph mode) is entered and left around
# every call on every thread: TF's eager_mode() is a generator, and one left
# suspended in a thread-local would be closed when that thread's state is
# cleared, at exit and on another thread, popping that thread's stack of TF
# context switches ("IndexError: pop from empty list" at exit).
_worker_scopes = threading.local()


cdef class _Scopes:
    """Eager mode plus the op's device, entered for one py_function call."""
    cdef list entered
    cdef object eager  # the entered eager_mode(), left at the end of the call
    cdef bint persistent
    cdef bytes device  # the op device it entered

    def __cinit__(self):
        self.entered = []

    cdef int enter(self, PfbCall* call) except -1:
        ctx = _tf_context()
        if not ctx.executing_eagerly():
            manager = _eager_mode()
            manager.__enter__()
            self.eager = manager
        self.persistent = call.flags & PFB_CALL_WORKER_THREAD
        name = call.device_name if call.device_name != NULL else None  # bytes
        if self.persistent:
            installed = getattr(_worker_scopes, "scopes", None)
            if installed is not None and (<_Scopes>installed).device == name:
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
        if not self.persistent:
            self.exit()
        if self.eager is not None:
            manager, self.eager = self.eager, None
            manager.__exit__(None, None, None)
        return 0


cdef int _run_tensors(PfbCall* call, _CallCounts* counting) except -1:
    """A py_function call: EagerTensors in, EagerTensors (or arrays) out."""
    _import_tensorflow()
    args = _input_tensors(call, counting)
    entry = _lookup(call.key, call.key_len)
    try:
        _call_tensors(call, entry, args, counting)
    except BaseException:
        if counting != NULL:
            _stats_end(counting, entry, True)
        raise
    if counting != NULL:
        _stats_end(counting, entry, False)
    return 0


cdef int _call_tensors(PfbCall* call, object entry, tuple args,
                       _CallCounts* counting) except -1:
    # Eager kernels always see their outputs required: the op layer knows
    # whether a tape watches the call.
    cdef bint record = (call.flags & PFB_CALL_RECORD) and entry.record
    cdef _Forward forward
    cdef _Scopes scopes = _Scopes()
    scopes.enter(call)
    if counting != NULL:
        counting.called = _now()
    try:
        if record:
            tape = _GradientTape(persistent=True)
            tape.__enter__()
            try:
                sources = tuple([a for a in args if _differentiable(a)])
                tape.watch(sources)
                results = entry.func(*args)
            finally:
                tape.__exit__(None, None, None)
        else:
            results = entry.func(*args)
        if counting != NULL:
            counting.returned = _now()
        args = None
        _export_results(call, results, counting)
    finally:
        scopes.leave()
    if record:
        forward = _Forward.__new__(_Forward)
        forward.tape = tape
        forward.sources = sources
        forward.targets = [
            results[i] if _is_eager_tensor(results[i]) else None
            for i in range(call.num_outputs) if _floating_spec(&call.output_specs[i])]
        Py_INCREF(forward)  # the new reference PfbCall.state hands to the kernel
        call.state = <void*>forward
    return 0


cdef int _run_gradient(PfbCall* call) except -1:
    """The gradient of one recorded py_function call."""
    _import_tensorflow()
    cdef _Forward forward = <_Forward>call.state
    grads = _input_tensors(call, NULL)
    cdef _Scopes scopes = _Scopes()
    scopes.enter(call)
    try:
        # One gradient per floating output; those of outputs TF did not compute
        # contribute nothing.
        if len(grads) != len(forward.targets):
            raise ValueError(
                f"pyfunc_bridge: the py_function gradient got {len(grads)} output "
                f"gradients for {len(forward.targets)} floating outputs")
        pairs = [(t, g) for t, g in zip(forward.targets, grads) if t is not None]
        if forward.sources and pairs:
            results = forward.tape.gradient([t for t, _ in pairs], forward.sources,
                                            output_gradients=[g for _, g in pairs],
                                            unconnected_gradients=_unconnected_zero)
            # Sparse gradients (tf.gather) become dense tensors.
            results = [r if _is_eager_tensor(r) else _tf_convert(r) for r in results]
        else:
            results = [_tf_zeros(s.shape, s.dtype) for s in forward.sources]
        _export_results(call, results, NULL)
    finally:
        scopes.leave()
    return 0
