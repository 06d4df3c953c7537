# TensorFlow: every lazy import of it (TF is imported by the op layer before
# this module, but its modules are looked up on first use here, one place),
# and TF's eager tensors <-> DLPack owners (READ_ONLY, bool as kDLBool).

# Each is None until first use (module-level objects start as None).
cdef object _tfe  # tensorflow.python.pywrap_tfe
cdef object _tf_context, _eager_mode, _GradientTape, _unconnected_zero, _error_types
cdef object _tf_constant, _tf_zeros, _tf_convert, _tf_string, _tf_deep_copy
cdef object _eager_tensor_type, _has_gpu, _sole_device_name


cdef int _load_tf() except -1:
    """Looks TensorFlow's modules up (once) and initializes its eager context."""
    global _tfe, _tf_context, _eager_mode, _GradientTape, _tf_constant, _tf_zeros
    global _tf_convert, _tf_string, _unconnected_zero, _error_types, _tf_deep_copy
    if _tfe is not None:
        return 0
    import tensorflow as tf
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors
    context.context().ensure_initialized()  # what tf.experimental.dlpack does first
    _tf_context = context.context
    _eager_mode = context.eager_mode
    _GradientTape = tf.GradientTape
    _tf_constant = tf.constant
    _tf_zeros = tf.zeros
    _tf_convert = tf.convert_to_tensor
    _tf_string = tf.string
    _tf_deep_copy = tf.raw_ops.DeepCopy
    _unconnected_zero = tf.UnconnectedGradients.ZERO
    _error_types = errors.exception_type_from_error_code
    _tfe = pywrap_tfe
    return 0


cdef object _eager_type():
    """TensorFlow's EagerTensor class (without initializing the eager context)."""
    global _eager_tensor_type
    if _eager_tensor_type is None:
        from tensorflow.python.framework.ops import EagerTensor
        _eager_tensor_type = EagerTensor
    return _eager_tensor_type


cdef bint _is_eager_tensor(object obj):
    return isinstance(obj, _eager_type())


cdef bint _tf_has_gpu() except -1:
    """Whether TensorFlow sees a GPU (then CUDA memory may become a tensor)."""
    global _has_gpu
    if _has_gpu is None:
        import tensorflow as tf
        _has_gpu = bool(tf.config.list_physical_devices("GPU"))
    return _has_gpu


cdef object _stream_source = None  # the op layer's: CUDA device id -> TF's stream there
cdef dict _tf_streams = {}  # CUDA device id -> TF's compute stream there (a handle)


def set_gpu_stream_source(source):
    """`source(device_id)` gives the handle of the CUDA stream TensorFlow
    computes on at that GPU (the op layer runs an op of the kernel library)."""
    global _stream_source
    _stream_source = source


cdef object _tf_gpu_stream(int device_id):
    """TF's compute stream on CUDA device `device_id`, for a DLPack producer to
    order its work before (__dlpack__(stream=...)); 1, the legacy default
    stream, where it cannot be found."""
    stream = _tf_streams.get(device_id)
    if stream is None:
        try:
            stream = _stream_source(device_id) if _stream_source is not None else 1
        except Exception:
            stream = 1
        stream = _tf_streams[device_id] = stream or 1  # 0 is not a valid DLPack stream
    return stream


def _sync_tf_devices(stream):
    """Waits for TensorFlow's pending device work (a CUDA export's consumer
    stream cannot be joined to TensorFlow's streams from Python)."""
    import tensorflow as tf
    tf.test.experimental.sync_devices()


cdef bytes _sole_device(ctx):
    """The name (``/device:CPU:0``) of the process's only TF device, if it has
    just one: every TF op runs there, so no device scope is needed."""
    global _sole_device_name
    if _sole_device_name is None:
        devices = ctx.list_logical_devices()
        # b"\0" matches no device name.
        _sole_device_name = devices[0].name.encode() if len(devices) == 1 else b"\0"
    return _sole_device_name


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
    if datatype == PFB_TF_DT_STRING:
        raise TypeError(
            "tf.string tensors have no DLPack form; use pfb.to_numpy (an object "
            "array of bytes)")
    capsule = _tfe.TFE_ToDlpackCapsule(tensor)
    cdef DLManagedTensorVersioned* m = _consume_capsule(capsule, True)
    cdef _DLPackOwner owner = _adopt_checked(m)
    # TF's memory is immutable: no consumer may write it.
    m.flags |= DLPACK_FLAG_BITMASK_READ_ONLY
    if datatype == PFB_TF_DT_BOOL:
        m.dl_tensor.dtype.code = kDLBool  # TF exports bool as kDLUInt
    if m.dl_tensor.device.device_type == kDLCPU:
        # TF numbers its logical CPUs (CPU:1 exports as id 1); host memory is
        # one address space, which DLPack calls CPU device 0.
        m.dl_tensor.device.device_id = 0
    else:
        owner.synchronize = _sync_tf_devices
    if copy is True:
        return _adopt_checked(_private_copy(owner))
    return owner


cdef object _tf_tensor(_DLPackOwner owner):
    """An EagerTensor over the owner's memory, which TF then owns (zero-copy)."""
    _load_tf()
    capsule = _owner_dlpack(owner, None, None, None, None)  # TF reads legacy capsules only
    return _tfe.TFE_FromDlpackCapsule(capsule, _tf_context()._handle)
