# py_function calls: DLPack <-> EagerTensors, and the forward state that pairs
# each call with its gradient.  TF 2.21 reads and writes only legacy
# "dltensor" capsules, so the bridge's versioned tensors are wrapped in legacy
# ones on the way in and TF's legacy ones in versioned ones on the way out.
# TensorFlow's modules are looked up on the first such call.

cdef object _tfe = None            # tensorflow.python.pywrap_tfe
cdef object _tf_context = None     # tensorflow.python.eager.context
cdef object _EagerTensor = None
cdef object _GradientTape = None
cdef object _tf_constant = None
cdef object _tf_zeros = None
cdef object _tf_convert = None
cdef object _unconnected_zero = None


cdef int _import_tensorflow() except -1:
    global _tfe, _tf_context, _EagerTensor, _GradientTape, _tf_constant, _tf_zeros
    global _unconnected_zero, _tf_convert
    if _tfe is not None:
        return 0
    import tensorflow as tf
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops
    _tf_context = context
    _EagerTensor = ops.EagerTensor
    _GradientTape = tf.GradientTape
    _tf_constant = tf.constant
    _tf_zeros = tf.zeros
    _tf_convert = tf.convert_to_tensor
    _unconnected_zero = tf.UnconnectedGradients.ZERO
    _tfe = pywrap_tfe
    return 0


cdef void _delete_legacy(DLManagedTensor* legacy) noexcept nogil:
    """Deleter of a legacy wrapper: releases the versioned tensor it wraps."""
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>legacy.manager_ctx
    if m != NULL and m.deleter != NULL:
        m.deleter(m)
    free(legacy)


cdef void _legacy_capsule_destructor(object capsule) noexcept:
    # A capsule still named "dltensor" was never consumed: its tensor is ours.
    cdef DLManagedTensor* legacy
    if PyCapsule_IsValid(capsule, b"dltensor"):
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        if legacy != NULL and legacy.deleter != NULL:
            legacy.deleter(legacy)


cdef object _legacy_capsule(DLManagedTensorVersioned* managed):
    """A "dltensor" capsule that owns `managed` (released on every path)."""
    cdef DLManagedTensor* legacy = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
    if legacy == NULL:
        managed.deleter(managed)
        raise MemoryError("cannot allocate a DLPack tensor")
    legacy.dl_tensor = managed.dl_tensor  # shape/strides stay with `managed`
    legacy.manager_ctx = <void*>managed
    legacy.deleter = _delete_legacy
    try:
        return PyCapsule_New(<void*>legacy, b"dltensor",
                             <PyCapsule_Destructor>_legacy_capsule_destructor)
    except BaseException:
        _delete_legacy(legacy)
        raise


cdef tuple _input_tensors(PfbCall* call):
    """One EagerTensor per input, viewing TF's memory (strings: converted)."""
    cdef Py_ssize_t i, n = call.num_inputs
    cdef list capsules = []
    # Each input first becomes a capsule (or an owner) that frees it.
    for i in range(n):
        try:
            if _is_string_dtype(call.inputs[i].dl_tensor.dtype):
                capsules.append(_adopt(call.inputs[i]))
            else:
                capsules.append(_legacy_capsule(call.inputs[i]))
        except BaseException:
            for i in range(i + 1, n):
                call.inputs[i].deleter(call.inputs[i])
            raise
    ctx = _tf_context.context()
    ctx.ensure_initialized()  # a TF1 graph run by a Session may not have done it
    handle = ctx._handle
    args = []
    cdef DLManagedTensor* legacy
    for holder in capsules:
        if type(holder) is _DLPackOwner:
            args.append(_tf_constant(_view(<_DLPackOwner>holder, False)))
            continue
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(holder, b"dltensor")
        if (legacy.dl_tensor.device.device_type == kDLCPU
                and (<uintptr_t>legacy.dl_tensor.data + legacy.dl_tensor.byte_offset)
                % ALIGNMENT != 0):
            # TF's kernels assume aligned memory (an unaligned slice of a TF
            # buffer can reach us): such an input gets an aligned copy.
            holder = _aligned_copy_capsule(holder)
        args.append(_tfe.TFE_FromDlpackCapsule(holder, handle))
    return tuple(args)


cdef object _aligned_copy_capsule(object capsule):
    """A "dltensor" capsule over an aligned copy of the capsule's tensor."""
    cdef DLManagedTensor* legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    PyCapsule_SetName(capsule, b"used_dltensor")
    # From here on the owner releases the tensor, once the copy is made.
    cdef _DLPackOwner owner = _adopt(<DLManagedTensorVersioned*>legacy.manager_ctx)
    legacy.manager_ctx = NULL
    _delete_legacy(legacy)
    previous = cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
    try:
        copy = np.array(_view(owner, False), copy=True)
    finally:
        cnp.PyDataMem_SetHandler(previous)
    return copy.__dlpack__()


cdef void _delete_versioned(DLManagedTensorVersioned* managed) noexcept nogil:
    """Deleter of a versioned wrapper around a consumed legacy tensor."""
    cdef DLManagedTensor* legacy = <DLManagedTensor*>managed.manager_ctx
    if legacy != NULL and legacy.deleter != NULL:
        legacy.deleter(legacy)
    free(managed)


cdef DLManagedTensorVersioned* _export_tensor(object tensor, int index,
                                              const PfbOutputSpec* spec) except NULL:
    """An EagerTensor result -> a DLPack tensor on TF's memory (TF's tensors
    are immutable, so sharing it is always safe)."""
    capsule = _tfe.TFE_ToDlpackCapsule(tensor)
    cdef DLManagedTensor* legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    cdef DLTensor* t = &legacy.dl_tensor
    # On error the capsule, still unconsumed, releases TF's tensor itself.
    cdef bint same = (t.dtype.code == spec.dtype.code and t.dtype.bits == spec.dtype.bits
                      and t.dtype.lanes == spec.dtype.lanes)
    if not same and spec.dtype.code == kDLBool:
        same = tensor.dtype.is_bool  # TF exports bool as uint8
    elif same and t.dtype.code == kDLUInt and t.dtype.bits == 8:
        same = not tensor.dtype.is_bool
    if not same:
        want = _numpy_dtype(spec.dtype).name
        raise _OutputError(
            f"output {index}: Tout declares {want} but the function returned a "
            f"tensor of dtype {tensor.dtype.name}; return tf.cast(x, tf.{want}) or "
            f"declare Tout=tf.{tensor.dtype.name}")
    _check_dims(t.ndim, <npy_intp*>t.shape, spec, index)
    if (t.device.device_type != spec.device.device_type
            or t.device.device_id != spec.device.device_id):
        raise _OutputError(
            f"output {index}: the function returned a tensor on {tensor.device}, "
            f"but this output must be on the op's device "
            f"(DLPack device {spec.device.device_type}:{spec.device.device_id}); "
            f"create it under tf.device(...) or copy it with tf.identity")
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>malloc(
        sizeof(DLManagedTensorVersioned))
    if m == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    # From here on the versioned wrapper owns TF's tensor; the capsule must not.
    PyCapsule_SetName(capsule, b"used_dltensor")
    m.version.major = DLPACK_MAJOR_VERSION
    m.version.minor = DLPACK_MINOR_VERSION
    m.flags = DLPACK_FLAG_BITMASK_READ_ONLY
    m.dl_tensor = legacy.dl_tensor
    m.dl_tensor.dtype = spec.dtype  # TF exports bool as uint8
    m.manager_ctx = <void*>legacy
    m.deleter = _delete_versioned
    return m


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


cdef int _export_results(PfbCall* call, object results) except -1:
    """A py_function wrapper's flat result list -> the call's outputs."""
    cdef int i
    if len(results) != call.num_outputs:
        _check_count(results, call.num_outputs)
    for i in range(call.num_outputs):
        value = results[i]
        if type(value) is _EagerTensor and not _is_string_dtype(call.output_specs[i].dtype):
            call.outputs[i] = _export_tensor(value, i, &call.output_specs[i])
        else:
            if isinstance(value, _EagerTensor):
                value = value.numpy()  # strings: converted anyway
            call.outputs[i] = _export_output(<PyObject*>value, 1, i,
                                             &call.output_specs[i], PFB_COPY_NONE)
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


# TF's worker threads run nothing but kernels: the eager mode and device scope
# a py_function needs stay entered there (re-entered when the device changes);
# on Python's own threads they are entered and left around every call.
_worker_scopes = threading.local()


cdef class _Scopes:
    """Eager mode plus the op's device, entered for one py_function call."""
    cdef list entered
    cdef bint persistent
    cdef bytes device  # the op device it entered

    def __cinit__(self):
        self.entered = []

    cdef int enter(self, PfbCall* call) except -1:
        ctx = _tf_context.context()
        self.persistent = call.flags & PFB_CALL_WORKER_THREAD
        name = call.device_name if call.device_name != NULL else None  # bytes
        if self.persistent:
            installed = getattr(_worker_scopes, "scopes", None)
            if (installed is not None and (<_Scopes>installed).device == name
                    and ctx.executing_eagerly()):
                return 0
            if installed is not None:
                (<_Scopes>installed).exit()
            _worker_scopes.scopes = self
        self.device = name
        if not ctx.executing_eagerly():
            self._enter(_tf_context.eager_mode())
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
        """The end of one call: only Python's threads leave the scopes."""
        if not self.persistent:
            self.exit()
        return 0


cdef int _run_tensors(PfbCall* call) except -1:
    """A py_function call: EagerTensors in, EagerTensors (or arrays) out."""
    _import_tensorflow()
    args = _input_tensors(call)
    entry = _lookup(call.key, call.key_len)
    # Eager kernels always see their outputs required: the op layer knows
    # whether a tape watches the call.
    cdef bint record = (call.flags & PFB_CALL_RECORD) and entry.record
    cdef _Forward forward
    cdef _Scopes scopes = _Scopes()
    scopes.enter(call)
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
        args = None
        _export_results(call, results)
    finally:
        scopes.leave()
    if record:
        forward = _Forward.__new__(_Forward)
        forward.tape = tape
        forward.sources = sources
        forward.targets = [
            results[i] if type(results[i]) is _EagerTensor else None
            for i in range(call.num_outputs) if _floating_spec(&call.output_specs[i])]
        Py_INCREF(forward)  # the new reference PfbCall.state hands to the kernel
        call.state = <void*>forward
    return 0


cdef int _run_gradient(PfbCall* call) except -1:
    """The gradient of one recorded py_function call."""
    _import_tensorflow()
    cdef _Forward forward = <_Forward>call.state
    grads = _input_tensors(call)
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
            results = [r if type(r) is _EagerTensor else _tf_convert(r) for r in results]
        else:
            results = [_tf_zeros(s.shape, s.dtype) for s in forward.sources]
        _export_results(call, results)
    finally:
        scopes.leave()
    return 0
