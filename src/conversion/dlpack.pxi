# DLPack tensors <-> ndarrays.  Consuming: an owner object is the base of every
# view and calls the producer's deleter when the last view is gone.
# Producing: one malloc holds the managed struct, its shape and its strides.

# Every call adopts its inputs into owners: a free list spares the allocator.
@cython.freelist(16)
cdef class _DLPackOwner:
    """Owner of one DLPack tensor: the base object of the ndarrays that view
    its memory, and an exporter with the full DLPack protocol
    (``__dlpack__``/``__dlpack_device__``, dlpack_export.pxi).

    It implements no buffer protocol, so NumPy cannot make a read-only view
    of it writable again.  ``pyfunc_bridge.to_dlpack`` returns one.
    """
    cdef DLManagedTensorVersioned* managed
    cdef readonly bint writable
    # A call's input that is the call's alone (IS_COPIED, bridge_abi.h): its
    # views may be written, and seen by no one once they are gone.
    cdef bint private
    # A view or an earlier export still uses `managed`: exports share it.
    cdef bint shared
    # Called with the consumer's stream before CUDA memory is exported (None: nothing to wait for).
    cdef object synchronize

    def __dealloc__(self):
        cdef DLManagedTensorVersioned* m = self.managed
        self.managed = NULL
        if m != NULL and m.deleter != NULL:
            m.deleter(m)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the tensor (versioned when ``max_version >= (1, 0)``)."""
        return _owner_dlpack(self, stream, max_version, dl_device, copy)

    @property
    def dtype(self):
        """The NumPy dtype of the tensor (for adapters that check conversions)."""
        return _numpy_dtype(_owner_tensor(self).dtype)

    def __dlpack_device__(self):
        """``(device_type, device_id)`` of the memory, as DLPack numbers it."""
        cdef DLDevice d = _owner_tensor(self).device
        return (<int>d.device_type, d.device_id)

    def __repr__(self):
        if self.managed == NULL:
            return "<pyfunc_bridge DLPack tensor (exported)>"
        cdef DLTensor* t = &self.managed.dl_tensor
        shape = tuple([t.shape[i] for i in range(t.ndim)])
        return (f"<pyfunc_bridge DLPack tensor {_dtype_name(t.dtype)}{list(shape)} "
                f"on device {_device_name(t.device)}>")


cdef _DLPackOwner _adopt(DLManagedTensorVersioned* managed):
    """Takes ownership of `managed`: its deleter runs when the owner dies."""
    cdef _DLPackOwner owner = _DLPackOwner.__new__(_DLPackOwner)
    owner.managed = managed
    return owner


cdef _DLPackOwner _adopt_checked(DLManagedTensorVersioned* m):
    try:
        return _adopt(m)
    except BaseException:
        m.deleter(m)
        raise


cdef DLTensor* _owner_tensor(_DLPackOwner owner) except NULL:
    if owner.managed == NULL:
        raise BufferError(
            "this DLPack tensor was already exported (handed to a consumer, which "
            "now owns it); an exporter can be consumed once")
    return &owner.managed.dl_tensor


cdef object _view(_DLPackOwner owner, bint writable):
    """An ndarray viewing the owner's tensor (strings: a converted object array)."""
    cdef DLTensor* t = _owner_tensor(owner)
    cdef npy_intp dims[64]
    cdef npy_intp strides[64]
    cdef int i
    _check_shape_fields(t)
    for i in range(t.ndim):
        dims[i] = <npy_intp>t.shape[i]
    if _is_string_dtype(t.dtype):
        return _strings_from_records(t)
    cdef cnp.dtype descr = _numpy_dtype(t.dtype)
    cdef char* data = <char*>t.data + t.byte_offset
    if t.data == NULL:
        # Only empty tensors may have no memory; NumPy allocates a stub,
        # writable only where a view would be (one rule for every input).
        stub = np.empty(tuple([dims[i] for i in range(t.ndim)]), descr)
        stub.flags.writeable = writable
        return stub
    cdef npy_intp* stride_ptr = NULL
    if t.strides != NULL:
        for i in range(t.ndim):
            strides[i] = <npy_intp>(t.strides[i] * descr.itemsize)
        stride_ptr = strides
    # PyArray_NewFromDescr steals a reference to descr.
    Py_INCREF(descr)
    arr = <object>PyArray_NewFromDescr(
        &PyArray_Type, <PyArray_Descr*>descr, t.ndim, dims, stride_ptr,
        data, NPY_ARRAY_WRITEABLE if writable else 0, NULL)
    Py_XDECREF(<PyObject*>arr)  # the cast above took a second reference
    owner.writable = writable
    owner.shared = True  # the view needs the memory: later exports may not hand it out
    cnp.set_array_base(arr, owner)  # the view keeps the producer's memory alive
    return arr


cdef object _strings_from_records(DLTensor* t):
    shape = tuple([t.shape[i] for i in range(t.ndim)])
    cdef cnp.ndarray out = np.empty(shape, dtype=object)
    cdef Py_ssize_t n = out.size, i
    cdef const PfbStringRef* records = <const PfbStringRef*>(<char*>t.data + t.byte_offset)
    flat = out.reshape(-1)
    for i in range(n):
        flat[i] = records[i].data[:records[i].size]
    return out


cdef void _release_exported(DLManagedTensorVersioned* managed) noexcept nogil:
    """Deleter of the tensors we export: drops the array that owns the memory."""
    if managed == NULL:
        return
    if not Py_IsInitialized():
        return  # the interpreter is gone: leak rather than touch it
    with gil:
        Py_XDECREF(<PyObject*>managed.manager_ctx)
    free(managed)


cdef DLManagedTensorVersioned* _export(object keep_alive, DLDataType dtype,
                                       int ndim, const npy_intp* shape,
                                       const npy_intp* byte_strides,
                                       Py_ssize_t itemsize, void* data,
                                       uint64_t flags) except NULL:
    """A DLPack tensor over `data`, keeping `keep_alive` until the deleter runs."""
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>malloc(
        sizeof(DLManagedTensorVersioned) + 2 * ndim * sizeof(int64_t))
    if m == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    cdef int64_t* dl_shape = <int64_t*>(m + 1)
    cdef int64_t* dl_strides = dl_shape + ndim
    cdef int i
    for i in range(ndim):
        dl_shape[i] = shape[i]
        if byte_strides != NULL:
            dl_strides[i] = byte_strides[i] // itemsize
    m.version.major = DLPACK_MAJOR_VERSION
    m.version.minor = DLPACK_MINOR_VERSION
    m.flags = flags
    m.dl_tensor.data = data
    m.dl_tensor.device.device_type = kDLCPU
    m.dl_tensor.device.device_id = 0
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = dtype
    m.dl_tensor.shape = dl_shape
    m.dl_tensor.strides = dl_strides if byte_strides != NULL else NULL
    m.dl_tensor.byte_offset = 0
    m.deleter = _release_exported
    m.manager_ctx = <void*>keep_alive
    Py_INCREF(keep_alive)  # released by _release_exported
    return m


cdef DLManagedTensorVersioned* _export_array(cnp.ndarray arr, DLDataType dtype,
                                             bint owned=False) except NULL:
    """A DLPack tensor viewing `arr` (strides given only when not C-contiguous);
    `owned`: nothing else reaches its memory (flagged IS_COPIED)."""
    return _export(arr, dtype, arr.ndim, <npy_intp*>cnp.PyArray_DIMS(arr),
                   NULL if cnp.PyArray_IS_C_CONTIGUOUS(arr) else <npy_intp*>cnp.PyArray_STRIDES(arr),
                   cnp.PyArray_ITEMSIZE(arr), cnp.PyArray_DATA(arr),
                   DLPACK_FLAG_BITMASK_IS_COPIED if owned else 0)
