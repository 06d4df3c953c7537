# Consuming foreign DLPack tensors: objects with __dlpack__ and raw capsules of
# both kinds.  Every field is validated by a small check_* helper that raises
# BufferError with a precise message; the capsule is renamed used_* last, so a
# rejected capsule stays with its producer (its destructor frees it).

cdef extern from "Python.h":
    const char* PyCapsule_GetName(object capsule) except? NULL
    void* PyCapsule_GetPointer(object capsule, const char* name) except? NULL
    int PyCapsule_SetName(object capsule, const char* name) except -1
    bint PyCapsule_CheckExact(object o)

cdef enum:
    MAX_NDIM = 64             # NumPy's limit, far above TensorFlow's needs
    MAX_ELEMENT_BITS = 62     # a tensor's size in bits must fit an int64 comfortably

# DLPack device type numbers (dlpack.h) -> names, for messages.
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}

# The DLPack version this build asks producers for.
_MAX_VERSION = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)


cdef str _device_name(DLDevice d):
    return f"{_DEVICE_NAMES.get(<int>d.device_type, 'type ' + str(<int>d.device_type))}:{d.device_id}"


# ------------------------------------------------------------ check_* helpers

cdef int _check_version(const DLManagedTensorVersioned* m) except -1:
    if m.version.major != DLPACK_MAJOR_VERSION:
        raise BufferError(
            f"DLPack tensor has major version {m.version.major}.{m.version.minor}; this "
            f"build of pyfunc_bridge reads major version {DLPACK_MAJOR_VERSION}")
    return 0


cdef int _check_shape_fields(const DLTensor* t) except -1:
    """ndim in range, a shape array, no negative dimension, a sane size."""
    cdef int i
    cdef int bits = 0
    cdef int64_t d
    if t.ndim < 0 or t.ndim > MAX_NDIM:
        raise BufferError(f"DLPack tensor has ndim {t.ndim}; expected 0 to {MAX_NDIM}")
    if t.ndim > 0 and t.shape == NULL:
        raise BufferError("DLPack tensor has a NULL shape")
    for i in range(t.ndim):
        d = t.shape[i]
        if d < 0:
            raise BufferError(f"DLPack tensor has a negative dimension {d} (axis {i})")
        if d == 0:
            return 0  # empty: the other dimensions cannot make it huge
        while d > 0:
            bits += 1
            d >>= 1
    if bits > MAX_ELEMENT_BITS:
        raise BufferError(
            f"DLPack tensor shape {[t.shape[i] for i in range(t.ndim)]} is too large "
            f"to address")
    return 0


cdef int _check_dtype(const DLTensor* t) except -1:
    """A numeric dtype NumPy and TensorFlow share (raises via _numpy_dtype)."""
    if t.dtype.code == kDLOpaqueHandle:
        raise BufferError(
            f"unsupported DLPack dtype (code {t.dtype.code} = opaque handle, bits "
            f"{t.dtype.bits}); foreign tensors must be numeric or bool")
    _numpy_dtype(t.dtype)
    return 0


cdef int _check_device(const DLTensor* t, bint allow_cuda) except -1:
    if t.device.device_type == kDLCPU:
        return 0
    if t.device.device_type == kDLCUDA and allow_cuda:
        return 0
    where = "CPU or CUDA (TensorFlow has a GPU)" if allow_cuda else "CPU"
    raise BufferError(
        f"DLPack tensor is on device {_device_name(t.device)}; pyfunc_bridge accepts "
        f"{where} memory here; copy it to the host first (e.g. .cpu())")


cdef int _check_data(const DLTensor* t) except -1:
    cdef int i
    if t.data != NULL:
        return 0
    for i in range(t.ndim):
        if t.shape[i] == 0:
            return 0
    raise BufferError("DLPack tensor has NULL data but is not empty")


cdef int _check_tensor(const DLTensor* t, bint allow_cuda) except -1:
    _check_shape_fields(t)
    _check_dtype(t)
    _check_device(t, allow_cuda)
    _check_data(t)
    return 0


cdef bint _is_compact(const DLTensor* t) noexcept:
    """Row-major with no gaps (size-1 dimensions may have any stride)."""
    if t.strides == NULL:
        return True
    cdef int64_t expected = 1
    cdef int i
    for i in range(t.ndim - 1, -1, -1):
        if t.shape[i] == 0:
            return True
        if t.shape[i] != 1 and t.strides[i] != expected:
            return False
        expected *= t.shape[i]
    return True


cdef size_t _nbytes(const DLTensor* t) noexcept:
    cdef size_t n = (t.dtype.bits * t.dtype.lanes + 7) // 8
    cdef int i
    for i in range(t.ndim):
        n *= <size_t>t.shape[i]
    return n


# ---------------------------------------------------------------- consuming

cdef void _free_legacy_wrapper(DLManagedTensorVersioned* m) noexcept nogil:
    """Deleter of the versioned struct made around a legacy tensor."""
    cdef DLManagedTensor* legacy = <DLManagedTensor*>m.manager_ctx
    if legacy != NULL and legacy.deleter != NULL:
        legacy.deleter(legacy)
    free(m)


cdef DLManagedTensorVersioned* _wrap_legacy(DLManagedTensor* legacy) except NULL:
    """A versioned struct that owns `legacy` (its shape stays legacy's)."""
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>malloc(
        sizeof(DLManagedTensorVersioned))
    if m == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    m.version.major = DLPACK_MAJOR_VERSION
    m.version.minor = 0
    m.flags = 0
    m.dl_tensor = legacy.dl_tensor
    m.manager_ctx = legacy
    m.deleter = _free_legacy_wrapper
    return m


cdef DLManagedTensorVersioned* _consume_capsule(object capsule, bint allow_cuda) except NULL:
    """Validates a DLPack capsule and takes its tensor (legacy ones wrapped).

    The caller owns the result.  On error the capsule is left as it was.
    """
    if not PyCapsule_CheckExact(capsule):
        raise TypeError(
            f"expected a DLPack capsule or an object with __dlpack__, got "
            f"{type(capsule).__name__}")
    cdef const char* name = PyCapsule_GetName(capsule)
    cdef DLManagedTensorVersioned* m
    cdef DLManagedTensor* legacy
    if name != NULL and strcmp(name, b"dltensor_versioned") == 0:
        m = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, name)
        _check_version(m)  # before reading fields whose layout the version fixes
        _check_tensor(&m.dl_tensor, allow_cuda)
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")  # consumed: ours now
        return m
    if name != NULL and strcmp(name, b"dltensor") == 0:
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, name)
        _check_tensor(&legacy.dl_tensor, allow_cuda)
        m = _wrap_legacy(legacy)
        PyCapsule_SetName(capsule, b"used_dltensor")  # consumed: ours now
        return m
    cdef bytes kind = b"" if name == NULL else <bytes>name
    if kind.startswith(b"used_"):
        raise BufferError(
            f"this DLPack capsule was already consumed (its name is {kind.decode()!r}); "
            f"a capsule can be imported once: ask the producer for a new one")
    raise BufferError(
        f"capsule named {kind.decode(errors='replace')!r} is not a DLPack capsule "
        f"('dltensor' or 'dltensor_versioned')")
