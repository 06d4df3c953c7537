# Arrays of other frameworks (torch, JAX, ...): results judged by their
# framework's adapter, any DLPack producer consumed, and the inputs and results
# of array_function.  The adapter protocol is documented once, on
# pyfunc_bridge/_frameworks.py's Adapter; this layer reads name, modules,
# wrap_input, check_inputs, writable_elsewhere, to_capsule and (optional)
# resolve.

from functools import partial

cdef dict _adapters_by_module = {}   # top-level module name -> adapter
# id(result type) -> (weak reference to the type, handler).  Weakly keyed, so
# that dynamically made classes are not kept alive; an entry goes when its
# type dies, and the reference check catches an id reused before that.
cdef dict _handlers = {}
# pyfunc_bridge/_frameworks.py's rules, which a pool's workers call too: the
# not-exported text, lazy views, the adapter's export and its refusals.
cdef object _not_exported = None
cdef object _resolved_by = None
cdef object _result_capsule = None
cdef object _ResultError = None
cdef object _dlpack_device = None


def register_framework(adapter):
    """Judge results whose type lives in ``adapter.modules`` with ``adapter``."""
    for module in adapter.modules:
        _adapters_by_module[module] = adapter
    _handlers.clear()


def _register_adapters():
    """Every framework's arrays are judged by its adapter (imports no framework)."""
    global _not_exported, _resolved_by, _result_capsule, _ResultError, _dlpack_device
    from pyfunc_bridge import _frameworks
    _not_exported, _resolved_by = _frameworks.not_exported, _frameworks.resolved
    _result_capsule, _ResultError = _frameworks.result_capsule, _frameworks.ResultError
    _dlpack_device = _frameworks.dlpack_device
    ADAPTERS = _frameworks.ADAPTERS
    for adapter in ADAPTERS.values():
        register_framework(adapter)


def _immutable(obj, Py_ssize_t outside_refs):
    return False


def _unknown_memory(obj, Py_ssize_t outside_refs):
    return True  # no framework vouches for it: assume someone can write it


def _no_capsule(obj):
    return None


def _forget_handler(ref, key):
    if _handlers is None:
        return  # the module is being torn down at exit
    entry = _handlers.get(key)
    if entry is not None and entry[0] is ref:
        del _handlers[key]


cdef tuple _handler(object tp):
    """(writable_elsewhere, to_capsule, the adapter where it resolves lazy
    views or None) for results of type `tp`."""
    key = id(tp)
    entry = _handlers.get(key)
    if entry is not None and (<tuple>entry)[0]() is tp:
        return <tuple>(<tuple>entry)[1]
    if _is_eager_tensor_type(tp):
        handler = (_immutable, _no_capsule, None)
    else:
        module = getattr(tp, "__module__", None)  # may be None or anything (hole 5)
        adapter = (_adapters_by_module.get(module.partition(".")[0])
                   if type(module) is str else None)
        if adapter is None:
            handler = (_unknown_memory, _no_capsule, None)
        else:
            handler = (adapter.writable_elsewhere,
                       getattr(adapter, "to_capsule", _no_capsule),
                       adapter if hasattr(adapter, "resolve") else None)
    _handlers[key] = (weakref.ref(tp, partial(_forget_handler, key=key)), handler)
    return <tuple>handler


cdef object _resolved(object obj):
    """A resolved copy of `obj` when its framework says its memory does not hold
    its values as they read (torch's lazy conjugate / negative views); else None."""
    adapter = (<tuple>_handler(type(obj)))[2]
    if adapter is None:
        return None
    made, lazy = _resolved_by(adapter, obj)
    return made if lazy else None


cdef bint _is_eager_tensor_type(object tp):
    return issubclass(tp, _eager_type())


cdef DLManagedTensorVersioned* _consume(object obj, bint allow_cuda,
                                        object stream=None) except NULL:
    """Any DLPack producer (object or capsule) -> a validated tensor we own.

    Objects are asked for a versioned capsule (max_version) and fall back to
    the legacy call for producers that predate DLPack 1.0.  CPU memory is
    requested without a stream.  For CUDA memory the producer is given the
    stream its consumer reads on (DLPack's stream protocol: the producer makes
    that stream wait for its own work): `stream`, a kernel's stream, or by
    default TensorFlow's compute stream on the producer's device.
    """
    if PyCapsule_CheckExact(obj):
        return _consume_capsule(obj, allow_cuda)
    if _is_eager_tensor(obj):
        return _consume_owner(_tf_export(obj, None))
    capsule = (<tuple>_handler(type(obj)))[1](obj)  # a framework adapter's fast path
    if capsule is not None:
        return _consume_capsule(capsule, allow_cuda)
    dlpack = getattr(obj, "__dlpack__", None)
    if dlpack is None:
        raise TypeError(
            f"{type(obj).__name__} is not a DLPack producer (it has no __dlpack__); "
            f"pass an array of a DLPack-capable library or a DLPack capsule")
    cdef DLDevice device
    cdef DLTensor probe
    device_type, device_id = _dlpack_device(obj)
    device.device_type = <DLDeviceType><int>device_type
    device.device_id = <int32_t>device_id
    if device.device_type == kDLCPU:
        try:
            capsule = dlpack(max_version=_MAX_VERSION)
        except TypeError:
            capsule = dlpack()  # a producer without DLPack 1.0 keywords
    else:
        probe.device = device
        _check_device(&probe, allow_cuda)  # fail before the producer does any work
        if stream is None:
            stream = _tf_gpu_stream(device.device_id)
        try:
            capsule = dlpack(stream=stream, max_version=_MAX_VERSION)
        except TypeError:
            capsule = dlpack(stream=stream)
    return _consume_capsule(capsule, allow_cuda)


cdef DLManagedTensorVersioned* _consume_owner(_DLPackOwner owner) except NULL:
    """Takes the tensor out of an owner (see _hand_out)."""
    cdef DLManagedTensorVersioned* m = _hand_out(owner)
    owner.managed = NULL  # the caller owns it now
    return m


cdef DLManagedTensorVersioned* _export_dlpack_output(
        PyObject* raw, Py_ssize_t outside_refs, int index, const PfbOutputSpec* spec,
        int copy_mode, list ranges, _CallCounts* counts, void* stream,
        bint convert=False) except NULL:
    """One result of an array_function or py_function -> a DLPack tensor for
    the kernel (`stream`: the kernel's CUDA stream, or NULL).

    Objects exporting __dlpack__ go through the validated import: handed over
    as they are when the copy decision allows (nothing in Python can write
    the memory afterwards, aligned and compact), else copied once.  Everything
    else (ndarrays, scalars, lists, strings) takes the NumPy path
    (`convert`: _export_output's, for py_function).
    """
    value = <object>raw
    tp = type(value)
    if (_is_string_dtype(spec.dtype) or PyArray_Check(raw)
            or getattr(tp, "__dlpack__", None) is None or isinstance(value, np.generic)):
        return _export_output(raw, outside_refs, index, spec, copy_mode, counts,
                              False, False, None, convert)
    writable_elsewhere, to_capsule, resolver = _handler(tp)
    # A lazy view (torch's conjugate / negative views) is a fact: its memory
    # does not hold the values, so its adapter's resolved tensor, fresh and
    # held by nobody else, is what is exported; the copy decision names it.
    cdef bint lazy = False
    if resolver is not None:
        value, lazy = _resolved_by(resolver, value)
    cdef bint foreign = (copy_mode != PFB_COPY_TRUE and not lazy
                         and writable_elsewhere(value, outside_refs))
    cdef bint on_host = spec.device.device_type == kDLCPU
    try:
        capsule = _result_capsule(to_capsule, value, index, on_host)
    except _ResultError as exc:  # the adapter's export refused it, or device memory
        if exc.reason is not None:
            _raise_not_exported(value, index, spec, exc.reason)  # naming the declared dtype
        raise _OutputError(str(exc)) from None
    if capsule is None:
        capsule = value
    consumer = <uintptr_t>stream if stream != NULL else None
    cdef DLManagedTensorVersioned* m
    try:
        m = _consume(capsule, not on_host, consumer)
    except BufferError as exc:
        if not getattr(exc, "unsupported_dtype", False):
            raise
        _raise_not_exported(value, index, spec, exc)
    return _export_owner(_adopt_checked(m), value, index, spec, copy_mode, foreign, lazy,
                         ranges, counts)


cdef int _raise_not_exported(object value, int index, const PfbOutputSpec* spec,
                             object exc) except -1:
    """Result `value`, whose dtype DLPack or the bridge does not carry (`exc`
    says which), as the output's error."""
    raise _OutputError(_not_exported(value, index, exc, _dtype_name(spec.dtype))) from None


cdef DLManagedTensorVersioned* _export_owner(
        _DLPackOwner owner, object value, int index, const PfbOutputSpec* spec,
        int copy_mode, bint foreign, bint lazy, list ranges,
        _CallCounts* counts) except NULL:
    """A result's tensor (held by `owner`; `value`: the result, for messages)
    checked against the declaration, then shared or copied as the copy
    decision says.  `foreign`, `lazy`: the copy decision's facts about it;
    `ranges`: the inputs' memory ranges (read only when `foreign`)."""
    tp = type(value)
    cdef DLTensor* t = &owner.managed.dl_tensor
    # Host memory for a device output is copied there by the kernel (a GPU
    # keeps int32 in host memory; NumPy results).
    if not _same_memory(t.device, spec.device) and not (
            t.device.device_type == kDLCPU and spec.device.device_type == kDLCUDA):
        raise _OutputError(
            f"output {index}: the function returned a {tp.__name__} on "
            f"{_device_name(t.device)}, but this output must be on the op's device "
            f"{_device_name(spec.device)}; create it there (tf.device) or copy it")
    if t.dtype.code != spec.dtype.code or t.dtype.bits != spec.dtype.bits:
        raise _OutputError(
            f"output {index}: Tout declares {_dtype_name(spec.dtype)} but the function "
            f"returned a {tp.__name__} of dtype {_dtype_name(t.dtype)}; convert it to "
            f"{_dtype_name(spec.dtype)} or declare Tout=tf.{_dtype_name(t.dtype)}")
    if spec.ndim >= 0:  # (the description is built only where a shape is declared)
        _check_dims(t.ndim, t.shape, spec, index, f"a {tp.__name__}")
    if foreign and pfb_inside(<uintptr_t>t.data + t.byte_offset, _nbytes(t), ranges):
        foreign = False  # a view of an input: TensorFlow's memory, which nobody may write
    reason = _dl_copy_reason(t, copy_mode, foreign, lazy)
    if counts != NULL:
        _count_bytes(counts, reason, _nbytes(t))
    if reason is not None:
        if copy_mode == PFB_COPY_FALSE:
            _raise_copy_forbidden(index, reason)
        if _copy_needed(reason):
            if t.device.device_type != kDLCPU:
                return _device_copy(owner)
            return _private_copy(owner)
    return _hand_over(owner)


cdef DLManagedTensorVersioned* _device_copy(_DLPackOwner owner) except NULL:
    """A copy of a result in device memory, made by TensorFlow on its stream
    (DeepCopy; TF owns the copy, and its next op on that stream reads it)."""
    _load_tf()
    return _hand_over(_tf_export(_tf_deep_copy(x=_tf_tensor(owner)), None))  # compact


_register_adapters()
