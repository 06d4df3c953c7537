# Consuming foreign DLPack tensors: objects with __dlpack__ and raw capsules of
# both kinds.  Every field is validated by a small check_* helper that raises
# BufferError with a precise message; the capsule is renamed used_* last, so a
# rejected capsule stays with its producer (its destructor frees it).

from libc.stdint cimport INT64_MAX, UINTPTR_MAX

cdef extern from "Python.h":
    const char* PyCapsule_GetName(object capsule) except? NULL
    void* PyCapsule_GetPointer(object capsule, const char* name) except? NULL
    int PyCapsule_SetName(object capsule, const char* name) except -1
    bint PyCapsule_CheckExact(object o)

cdef enum:
    MAX_NDIM = 64             # NumPy's limit, far above TensorFlow's needs

# DLPack carries no buffer size, so a consistent lie cannot be caught; byte
# extents that overflow can.  Checked arithmetic, so that no wrapped value
# ever reaches a copy loop or a NumPy view (holes of issue 14).
cdef extern from *:
    """
    #include <stdint.h>
    static inline int pfb_mul_overflows(int64_t a, int64_t b, int64_t* out) {
        return __builtin_mul_overflow(a, b, out);
    }
    static inline int pfb_add_overflows(int64_t a, int64_t b, int64_t* out) {
        return __builtin_add_overflow(a, b, out);
    }
    """
    bint _mul_overflows "pfb_mul_overflows"(int64_t a, int64_t b, int64_t* out) noexcept nogil
    bint _add_overflows "pfb_add_overflows"(int64_t a, int64_t b, int64_t* out) noexcept nogil

# DLPack device type numbers (dlpack.h) -> names, for messages.
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}

# The DLPack version this build asks producers for.
_MAX_VERSION = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)


cdef str _device_name(DLDevice d):
    return f"{_DEVICE_NAMES.get(<int>d.device_type, 'type ' + str(<int>d.device_type))}:{d.device_id}"


cdef inline bint _same_memory(DLDevice a, DLDevice b) noexcept:
    """Whether memory on device `a` can be an output on (or exported to) device `b`: host memory
    is one address space (TF numbers logical CPUs: CPU:1 exports as kDLCPU id
    1), device memory must be on the op's own device."""
    return a.device_type == b.device_type and (a.device_type == kDLCPU
                                               or a.device_id == b.device_id)


# ------------------------------------------------------------ check_* helpers

cdef int _check_version(const DLManagedTensorVersioned* m) except -1:
    if m.version.major != DLPACK_MAJOR_VERSION:
        raise BufferError(
            f"DLPack tensor has major version {m.version.major}.{m.version.minor}; this "
            f"build of pyfunc_bridge reads major version {DLPACK_MAJOR_VERSION}")
    return 0


cdef int _check_shape_fields(const DLTensor* t) except -1:
    """ndim in range, a shape array, no negative dimension, a countable size.

    The element count leaves out zero dimensions, as NumPy's does: an empty
    tensor's other dimensions must still be representable.
    """
    cdef int i
    cdef int64_t count = 1
    if t.ndim < 0 or t.ndim > MAX_NDIM:
        raise BufferError(f"DLPack tensor has ndim {t.ndim}; expected 0 to {MAX_NDIM}")
    if t.ndim > 0 and t.shape == NULL:
        raise BufferError("DLPack tensor has a NULL shape")
    for i in range(t.ndim):
        if t.shape[i] < 0:
            raise BufferError(
                f"DLPack tensor has a negative dimension {t.shape[i]} (axis {i})")
    for i in range(t.ndim):
        if t.shape[i] != 0 and _mul_overflows(count, t.shape[i], &count):
            raise BufferError(
                f"DLPack tensor shape {_shape_list(t)} is too large to address (its "
                f"element count overflows 64 bits)")
    return 0


cdef list _shape_list(const DLTensor* t):
    return [t.shape[i] for i in range(t.ndim)]


cdef int _check_extent(const DLTensor* t) except -1:
    """Every byte offset the tensor can reach fits in 64 bits and in the
    address space (shape, strides and dtype already checked).

    Byte size, each byte stride, the lowest and highest byte reached and the
    byte_offset are computed with overflow checks: a wrapped value would make
    a copy read outside the buffer, or a view show the wrong elements.
    """
    cdef int64_t itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    cdef int64_t count = 1, nbytes, step, reach, lo = 0, hi = 0
    cdef int i
    cdef bint empty = False, overflow
    for i in range(t.ndim):
        if t.shape[i] == 0:
            empty = True
        else:
            count *= t.shape[i]  # cannot overflow: _check_shape_fields counted it
    if _mul_overflows(count, itemsize, &nbytes):
        raise BufferError(
            f"DLPack tensor shape {_shape_list(t)} of {itemsize}-byte elements is too large "
            f"to address (its byte size overflows 64 bits)")
    if t.byte_offset > <uint64_t>INT64_MAX:
        raise BufferError(
            f"DLPack tensor has byte_offset {t.byte_offset}, which overflows 64 bits "
            f"(signed); the data pointer plus the offset cannot be addressed")
    if t.strides != NULL:
        # NumPy views hold byte strides, even of axes of size 0 or 1.
        for i in range(t.ndim):
            if _mul_overflows(t.strides[i], itemsize, &step):
                raise BufferError(
                    f"DLPack tensor stride {t.strides[i]} of {itemsize}-byte elements "
                    f"overflows 64 bits in bytes (axis {i})")
    if empty or t.data == NULL:
        return 0  # no byte is ever read (NULL data: _check_data decides)
    if t.strides == NULL:
        hi = nbytes
    else:
        for i in range(t.ndim):
            step = t.strides[i] * itemsize  # checked above
            overflow = _mul_overflows(t.shape[i] - 1, step, &reach)
            if not overflow:
                if reach > 0:
                    overflow = _add_overflows(hi, reach, &hi)
                else:
                    overflow = _add_overflows(lo, reach, &lo)
            if overflow:
                raise BufferError(
                    f"DLPack tensor's byte extent overflows 64 bits at axis {i} (shape "
                    f"{_shape_list(t)}, strides {[t.strides[j] for j in range(t.ndim)]}, "
                    f"{itemsize}-byte elements)")
    if (_add_overflows(hi, itemsize if t.strides != NULL else 0, &hi)  # the last element's bytes
            or _add_overflows(lo, <int64_t>t.byte_offset, &lo)
            or _add_overflows(hi, <int64_t>t.byte_offset, &hi)):
        raise BufferError(
            f"DLPack tensor's byte extent plus byte_offset {t.byte_offset} overflows 64 bits")
    cdef uintptr_t data = <uintptr_t>t.data
    if lo < 0 and data < <uintptr_t>(-(lo + 1)) + 1:
        raise BufferError(
            f"DLPack tensor reaches below address 0: data {data:#x}, lowest byte at "
            f"offset {lo}; its strides or byte_offset are wrong")
    if hi > 0 and data > UINTPTR_MAX - <uintptr_t>hi:
        raise BufferError(
            f"DLPack tensor reaches past the end of the address space: data {data:#x}, "
            f"highest byte at offset {hi}; its strides or byte_offset are wrong")
    return 0


cdef int _check_dtype(const DLTensor* t) except -1:
    """A numeric dtype NumPy and TensorFlow share (raises via _numpy_dtype)."""
    if t.dtype.code == kDLOpaqueHandle:
        raise _unsupported_dtype(
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


cdef bint _dl_empty(const DLTensor* t) noexcept:
    """Whether the tensor has no element (a dimension of 0)."""
    cdef int i
    for i in range(t.ndim):
        if t.shape[i] == 0:
            return True
    return False


cdef int _check_data(const DLTensor* t) except -1:
    if t.data != NULL or _dl_empty(t):
        return 0
    raise BufferError("DLPack tensor has NULL data but is not empty")


cdef int _check_tensor(const DLTensor* t, bint allow_cuda) except -1:
    _check_shape_fields(t)
    _check_dtype(t)
    _check_device(t, allow_cuda)
    _check_data(t)
    _check_extent(t)
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


cdef void _free_offset_wrapper(DLManagedTensorVersioned* m) noexcept nogil:
    """Deleter of the struct made by _fold_offset: frees the producer's tensor."""
    cdef DLManagedTensorVersioned* inner = <DLManagedTensorVersioned*>m.manager_ctx
    if inner != NULL and inner.deleter != NULL:
        inner.deleter(inner)
    free(m)


cdef DLManagedTensorVersioned* _fold_offset(DLManagedTensorVersioned* m) except NULL:
    """`m` with its byte_offset folded into the data pointer (byte_offset 0).

    TensorFlow's DLPack import refuses any non-zero byte_offset.  A producer's
    struct is left as it made it (its deleter may read it): the fold happens in
    a wrapper that owns it.  On error the caller still owns `m`.
    """
    cdef DLManagedTensorVersioned* w = <DLManagedTensorVersioned*>malloc(
        sizeof(DLManagedTensorVersioned))
    if w == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    w[0] = m[0]
    w.dl_tensor.data = <char*>m.dl_tensor.data + m.dl_tensor.byte_offset
    w.dl_tensor.byte_offset = 0
    w.manager_ctx = m  # the wrapper owns the producer's tensor now
    w.deleter = _free_offset_wrapper
    return w


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
        if m.dl_tensor.byte_offset != 0 and m.dl_tensor.data != NULL:
            m = _fold_offset(m)  # before the rename: on error the producer keeps it
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")  # consumed: ours now
        return m
    if name != NULL and strcmp(name, b"dltensor") == 0:
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, name)
        _check_tensor(&legacy.dl_tensor, allow_cuda)
        m = _wrap_legacy(legacy)
        if m.dl_tensor.data != NULL:
            # The wrapper is ours: fold the offset in place (TF accepts only 0).
            m.dl_tensor.data = <char*>m.dl_tensor.data + m.dl_tensor.byte_offset
            m.dl_tensor.byte_offset = 0
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
