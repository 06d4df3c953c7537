# The copy policy: `copy=` (NumPy 2's tri-state) and the one decision whether
# memory handed to TensorFlow is shared or copied, and why.  The callers only
# gather facts (who else can write the memory, its layout); _copy_reason
# decides, for op results (outputs.pxi, frameworks.pxi), py_function inputs
# (tensors.pxi) and the public conversion API (dlpack_api.pxi) alike.

# Why bytes were copied ("worker": into shared memory, on the way to and from
# a worker process, executor=); the order of the statistics' counters (stats.pxi)
# and of pyfunc_bridge.stats()'s bytes_copied.
COPY_REASONS = ("unaligned", "non_contiguous", "aliasing", "dtype_conversion",
                "string", "copy_requested", "lazy_view", "worker", "shared_input")

_COPY_REASON_TEXT = {
    "aliasing": "its memory is still reachable from Python after the call (a global, "
                "a closure, an attribute or another view of it), so Python could change "
                "the tensor later",
    "non_contiguous": "it is not C-contiguous (a strided or transposed view)",
    "unaligned": "its data is not 64-byte aligned, which TensorFlow needs to share it",
    "lazy_view": "it is a lazy conjugate or negative view (torch), whose memory does not "
                 "hold its values until it is resolved into a new tensor",
    "shared_input": "TensorFlow shares the input's buffer with other tensors (a constant, "
                    "an eager tensor Python holds, a slice of a bigger tensor), so the "
                    "function, which may write its inputs in place, gets a private copy",
}

# copy= -> (the ops' `copy` attribute, bridge_abi.h's PFB_COPY_*).
cdef dict _COPY_POLICIES = {
    None: ("none", PFB_COPY_NONE),
    True: ("true", PFB_COPY_TRUE),
    False: ("false", PFB_COPY_FALSE),
}


cdef int _check_copy(object copy) except -1:
    """The one validation of a `copy=` argument."""
    if copy is not None and type(copy) is not bool:
        raise ValueError(f"copy must be None, True or False, got {copy!r}")
    return 0


def copy_policy(copy):
    """``copy=`` -> (the op's ``copy`` attribute, the PfbCall copy mode).

    >>> copy_policy(None), copy_policy(True)
    (('none', 0), ('true', 1))
    """
    _check_copy(copy)
    return _COPY_POLICIES[copy]


cdef object _copy_reason(int copy_mode, bint empty, bint writable_elsewhere,
                         bint compact, bint aligned, bint lazy=False):
    """The copy decision: None to share the memory with TensorFlow, else why
    it is copied (a COPY_REASONS entry).

    `empty`: no element (nothing to share or protect; TF allocates it);
    `writable_elsewhere`: Python could write the memory after the call;
    `compact`: row-major without gaps; `aligned`: to PFB_TENSOR_ALIGNMENT;
    `lazy`: the memory is a lazy view's resolved copy (an adapter's
    `resolve`: torch's conjugate / negative views, whose own memory does not
    hold their values), fresh, and the other facts are its own.
    Under copy=False a reason is the caller's error to raise.  "lazy_view" is
    the one reason whose copy is already made (_copy_needed): under copy=False
    it comes first, since resolving was a copy; otherwise it is given only
    when the resolved tensor can be shared as it is.
    """
    if empty:
        return None
    if copy_mode == PFB_COPY_TRUE:
        return "copy_requested"
    if lazy and copy_mode == PFB_COPY_FALSE:
        return "lazy_view"
    if writable_elsewhere:
        return "aliasing"
    if not compact:
        return "non_contiguous"
    if not aligned:
        return "unaligned"
    if lazy:
        return "lazy_view"
    return None


cdef inline bint _copy_needed(object reason):
    """Whether the caller copies for `reason` (not None, copy=None/True): every
    reason but "lazy_view", whose copy the adapter's resolve has made (the
    resolved tensor is shared)."""
    return reason != "lazy_view"


cdef inline bint _aligned(const void* data) noexcept:
    return <uintptr_t>data % PFB_TENSOR_ALIGNMENT == 0


# ------------------------------------------------------------------ facts

cdef int _input_end(PyObject* end, void* ctx) noexcept:
    """How the conversion layer judges the end of a result's base chain
    (copy_facts.h's pfb_writable_elsewhere, the one rule): a read-only input
    view is TF memory that nobody can write; an input that is the call's alone
    is safe while only the chain reaches it."""
    if Py_TYPE(end) != <PyTypeObject*>_DLPackOwner:
        return PFB_END_FOREIGN
    if not (<_DLPackOwner>end).writable:
        return PFB_END_READ_ONLY
    return PFB_END_PRIVATE if _private_input(end) else PFB_END_FOREIGN


cdef inline bint _array_writable_elsewhere(PyObject* obj, Py_ssize_t outside_refs) noexcept:
    """Whether Python could write a result ndarray's memory after the call,
    given the `outside_refs` references to it that the bridge does not hold:
    copy_facts.h's rule, which a pool's workers judge with too."""
    return pfb_writable_elsewhere(obj, outside_refs, _input_end, NULL)


cdef bint _private_input(PyObject* base):
    """Whether `base`, the end of a base chain, is an input that is the call's
    alone (IS_COPIED, bridge_abi.h) and that the chain is the only referrer of."""
    if Py_TYPE(base) != <PyTypeObject*>_DLPackOwner:
        return False
    # Read before the cast below, which may take a reference.
    cdef bint sole = Py_REFCNT(base) == 1 and not pfb_weakly_referenced(base)
    return sole and (<_DLPackOwner>base).private


cdef bint _owned_memory(PyObject* obj):
    """Whether nothing but the array `obj`'s base chain reaches its memory, so
    TF may write it in place once it is handed over (IS_COPIED): every array
    on the chain referenced only by its successor, ending at an array that
    owns its data or at an input that is the call's alone.  Decided after
    the copy decision made the chain private (_array_writable_elsewhere)."""
    cdef PyObject* base = PyArray_BASE(<PyArrayObject*>obj)
    while base != NULL and PyArray_Check(base):
        if Py_REFCNT(base) != 1 or pfb_weakly_referenced(base):
            return False
        obj = base
        base = PyArray_BASE(<PyArrayObject*>base)
    if base == NULL:
        return (PyArray_FLAGS(<PyArrayObject*>obj) & NPY_ARRAY_OWNDATA) != 0
    return _private_input(base)


cdef bint _readonly_memory(object arr):
    """Whether nobody can write the array's memory through Python: every array
    on the base chain is read-only and the chain ends at memory that cannot be
    made writable again (a read-only bridge view of TF memory, or bytes)."""
    cdef PyObject* obj = <PyObject*>arr
    while PyArray_Check(obj):
        if PyArray_FLAGS(<PyArrayObject*>obj) & NPY_ARRAY_WRITEABLE:
            return False
        obj = PyArray_BASE(<PyArrayObject*>obj)
        if obj == NULL:
            return False  # owns its data: its WRITEABLE flag can be set again
    if Py_TYPE(obj) == <PyTypeObject*>_DLPackOwner:
        return not (<_DLPackOwner>obj).writable
    return Py_TYPE(obj) == <PyTypeObject*>bytes


cdef object _dl_copy_reason(const DLTensor* t, int copy_mode, bint writable_elsewhere,
                            bint lazy=False):
    """_copy_reason with the layout facts of a DLPack tensor."""
    return _copy_reason(copy_mode, _dl_empty(t), writable_elsewhere, _is_compact(t),
                        _aligned(<char*>t.data + t.byte_offset), lazy)


cdef object _array_copy_reason(PyArrayObject* arr, int copy_mode, bint writable_elsewhere):
    """_copy_reason with the layout facts of an ndarray."""
    return _copy_reason(copy_mode, PyArray_SIZE(arr) == 0, writable_elsewhere,
                        PyArray_IS_C_CONTIGUOUS(arr),
                        pfb_array_aligned(<PyObject*>arr, PFB_TENSOR_ALIGNMENT, False))


cdef DLManagedTensorVersioned* _input_given_back(PyObject* raw, Py_ssize_t outside_refs,
                                                 const PfbOutputSpec* spec) noexcept:
    """The input tensor that result `raw` (an ndarray) views whole, taken from
    its owner, or NULL.  The kernel then hands on TF's own input tensor (the
    output is the input, as for TF's own pass-through kernels): no export, no
    Python object kept alive, no deleter that needs the GIL.

    Only when nothing in Python can reach that memory after the call: the
    bridge holds the only reference to `raw` (`outside_refs` 0, no weak
    reference), `raw` is the owner's only referrer, and `raw` is the owner's
    read-only view of the whole tensor (same data, shape and dtype, compact).
    The view dies with the bridge's reference, before the kernel drops the
    input; an owner that has given its tensor back frees nothing.
    """
    cdef PyArrayObject* arr = <PyArrayObject*>raw
    cdef PyObject* base = PyArray_BASE(arr)
    if (outside_refs != 0 or base == NULL or Py_TYPE(base) != <PyTypeObject*>_DLPackOwner
            or Py_REFCNT(base) != 1 or pfb_weakly_referenced(raw)):
        return NULL
    cdef DLManagedTensorVersioned* m = (<_DLPackOwner>base).managed
    if m == NULL or ((<_DLPackOwner>base).writable and not (<_DLPackOwner>base).private):
        return NULL
    cdef DLTensor* t = &m.dl_tensor
    cdef int i
    if (t.strides != NULL or t.byte_offset != 0 or t.device.device_type != kDLCPU
            or t.data != PyArray_DATA(arr) or t.ndim != PyArray_NDIM(arr)
            or t.dtype.code != spec.dtype.code or t.dtype.bits != spec.dtype.bits
            or t.dtype.lanes != spec.dtype.lanes):
        return NULL
    for i in range(t.ndim):
        if t.shape[i] != PyArray_DIMS(arr)[i]:
            return NULL
    (<_DLPackOwner>base).managed = NULL  # the kernel owns it now
    return m
