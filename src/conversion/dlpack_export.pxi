# Producing DLPack capsules: the exporter protocol of _DLPackOwner
# (__dlpack__ with stream / max_version / dl_device / copy), capsules of both
# kinds with destructors that free only unconsumed tensors, and the exports of
# TensorFlow tensors (READ_ONLY, bool as kDLBool).

from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.pycapsule cimport PyCapsule_IsValid

# Capsule destructors may run while an exception is being raised: the pending
# exception is set aside so that deleters that call into Python work.

cdef void _versioned_capsule_destructor(object capsule) noexcept:
    # Only a capsule nobody consumed still owns its tensor (consumers rename it).
    cdef DLManagedTensorVersioned* m
    cdef PyObject *exc_type, *exc_value, *exc_tb
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        m = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if m != NULL and m.deleter != NULL:
            PyErr_Fetch(&exc_type, &exc_value, &exc_tb)
            m.deleter(m)
            PyErr_Restore(exc_type, exc_value, exc_tb)


cdef void _legacy_capsule_destructor(object capsule) noexcept:
    cdef DLManagedTensor* m
    cdef PyObject *exc_type, *exc_value, *exc_tb
    if PyCapsule_IsValid(capsule, b"dltensor"):
        m = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        if m != NULL and m.deleter != NULL:
            PyErr_Fetch(&exc_type, &exc_value, &exc_tb)
            m.deleter(m)
            PyErr_Restore(exc_type, exc_value, exc_tb)


cdef void _free_versioned_in_legacy(DLManagedTensor* legacy) noexcept nogil:
    """Deleter of the legacy struct made around a versioned tensor."""
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>legacy.manager_ctx
    if m != NULL and m.deleter != NULL:
        m.deleter(m)
    free(legacy)


cdef object _capsule(DLManagedTensorVersioned* m, bint versioned):
    """A capsule owning `m`; on error the caller still owns `m`."""
    cdef DLManagedTensor* legacy
    if versioned:
        return PyCapsule_New(m, b"dltensor_versioned", _versioned_capsule_destructor)
    # Legacy consumers: one allocation that borrows m's shape and owns m.
    legacy = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
    if legacy == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    legacy.dl_tensor = m.dl_tensor
    legacy.manager_ctx = m
    legacy.deleter = _free_versioned_in_legacy
    try:
        return PyCapsule_New(legacy, b"dltensor", _legacy_capsule_destructor)
    except BaseException:
        free(legacy)
        raise


cdef bint _wants_versioned(object max_version) except -1:
    if max_version is None:
        return False
    if (type(max_version) is not tuple or len(max_version) != 2
            or not all([type(v) is int for v in max_version])):
        raise TypeError(f"max_version must be None or a (major, minor) tuple of ints, "
                        f"got {max_version!r}")
    return max_version[0] >= 1


cdef int _check_stream(const DLTensor* t, object stream) except -1:
    """The array API's rules for `stream` (CPU: None; CUDA: an int, not 0)."""
    if t.device.device_type == kDLCPU:
        if stream is not None and stream != -1:
            raise BufferError(
                f"stream={stream!r} was given for CPU memory; CPU exports take "
                f"stream=None")
        return 0
    if stream is None or stream == -1:
        return 0
    if type(stream) is not int:
        raise TypeError(f"stream must be None or an int, got {type(stream).__name__}")
    if stream == 0:
        raise BufferError("stream=0 is ambiguous in DLPack; pass 1 (legacy default "
                          "stream), 2 (per-thread default stream) or a stream handle")
    return 0


cdef DLManagedTensorVersioned* _hand_out(_DLPackOwner owner) except NULL:
    """The owner's tensor, if nothing else reads it (the caller clears owner.managed)."""
    _owner_tensor(owner)
    if owner.shared:
        raise BufferError(
            "this DLPack tensor's memory is viewed by an ndarray the bridge made; "
            "it cannot be handed to another consumer (pass copy=True)")
    return owner.managed


cdef DLManagedTensorVersioned* _private_copy(_DLPackOwner owner) except NULL:
    """A 64-byte aligned, C-contiguous copy of a CPU tensor, flagged IS_COPIED."""
    cdef DLTensor* t = _owner_tensor(owner)
    if t.device.device_type != kDLCPU:
        raise BufferError(
            f"cannot copy memory on device {_device_name(t.device)}; pyfunc_bridge copies "
            f"host memory only")
    cdef DLDataType dtype = t.dtype
    cdef bint was_shared = owner.shared
    view = _view(owner, False)
    with aligned_allocation():
        arr = np.array(view, order="C", copy=True)
    del view
    owner.shared = was_shared  # the temporary view is gone
    cdef DLManagedTensorVersioned* m = _export_array(arr, dtype)
    m.flags = DLPACK_FLAG_BITMASK_IS_COPIED
    return m


cdef object _owner_dlpack(_DLPackOwner owner, object stream, object max_version,
                          object dl_device, object copy):
    """__dlpack__ of an owner: hands its tensor out (once), or a private copy."""
    cdef DLTensor* t = _owner_tensor(owner)
    cdef DLManagedTensorVersioned* m
    cdef bint versioned = _wants_versioned(max_version)
    _check_stream(t, stream)
    if dl_device is not None:
        want = (int(dl_device[0]), int(dl_device[1]))
        # Host memory is one address space: any CPU device id is this one.
        if want[0] != <int>t.device.device_type or (
                want[0] != kDLCPU and want[1] != t.device.device_id):
            raise BufferError(
                f"cannot export to device {want}: the tensor is on "
                f"{_device_name(t.device)} and pyfunc_bridge does not copy across devices")
    if copy is not None and type(copy) is not bool:
        raise ValueError(f"copy must be None, True or False, got {copy!r}")
    if copy is True:
        m = _private_copy(owner)
        try:
            return _capsule(m, versioned)
        except BaseException:
            m.deleter(m)
            raise
    if t.device.device_type != kDLCPU and owner.synchronize is not None and stream != -1:
        owner.synchronize(stream)
    m = _hand_out(owner)
    capsule = _capsule(m, versioned)  # on error the owner keeps m
    owner.managed = NULL  # the capsule owns it now
    return capsule


# ----------------------------------------------------- TensorFlow's tensors

cdef object _tfe = None  # tensorflow.python.pywrap_tfe, imported on first use
cdef object _tf_context = None


cdef _load_tf():
    global _tfe, _tf_context
    if _tfe is None:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context
        context.context().ensure_initialized()  # what tf.experimental.dlpack does first
        _tf_context = context.context
        _tfe = pywrap_tfe


def _sync_tf_devices(stream):
    """Waits for TensorFlow's pending device work (a CUDA export's consumer
    stream cannot be joined to TensorFlow's streams from Python)."""
    import tensorflow as tf
    tf.test.experimental.sync_devices()


cdef int _check_tensor_arg(object tensor, str api) except -1:
    if not _is_eager_tensor(tensor):
        if hasattr(tensor, "graph"):
            raise TypeError(
                f"{api} takes an eager tf.Tensor, got a symbolic tensor of a graph; "
                f"inside tf.function use pfb.array_function or pfb.numpy_function")
        raise TypeError(f"{api} takes an eager tf.Tensor, got {type(tensor).__name__}")
    return 0


cdef _DLPackOwner _tf_export(object tensor, object copy):
    """An owner of a TF tensor's memory (zero-copy), READ_ONLY, bool as kDLBool."""
    _load_tf()
    cdef int datatype = tensor._datatype_enum()  # cheaper than tensor.dtype
    if datatype == TF_DT_STRING:
        raise TypeError(
            "tf.string tensors have no DLPack form; use pfb.to_numpy (an object "
            "array of bytes)")
    capsule = _tfe.TFE_ToDlpackCapsule(tensor)
    cdef DLManagedTensorVersioned* m = _consume_capsule(capsule, True)
    cdef _DLPackOwner owner
    try:
        owner = _adopt(m)
    except BaseException:
        m.deleter(m)
        raise
    # TF's memory is immutable: no consumer may write it.
    m.flags |= DLPACK_FLAG_BITMASK_READ_ONLY
    if datatype == TF_DT_BOOL:
        m.dl_tensor.dtype.code = kDLBool  # TF exports bool as kDLUInt
    if m.dl_tensor.device.device_type == kDLCPU:
        # TF numbers its logical CPUs (CPU:1 exports as id 1); host memory is
        # one address space, which DLPack calls CPU device 0.
        m.dl_tensor.device.device_id = 0
    if m.dl_tensor.device.device_type != kDLCPU:
        owner.synchronize = _sync_tf_devices
    if copy is True:
        return _adopt_checked(_private_copy(owner))
    return owner


cdef _DLPackOwner _adopt_checked(DLManagedTensorVersioned* m):
    try:
        return _adopt(m)
    except BaseException:
        m.deleter(m)
        raise


# TensorFlow's DataType enum (types.proto), as EagerTensor._datatype_enum() gives it.
cdef enum:
    TF_DT_STRING = 7
    TF_DT_BOOL = 10


cdef object _tf_tensor(_DLPackOwner owner):
    """An EagerTensor over the owner's memory, which TF then owns (zero-copy)."""
    _load_tf()
    capsule = _owner_dlpack(owner, None, None, None, None)  # TF reads legacy capsules only
    return _tfe.TFE_FromDlpackCapsule(capsule, _tf_context()._handle)
