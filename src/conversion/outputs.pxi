# Results of the registered function -> DLPack tensors: count, dtype and shape
# checked against what the op declares, then the copy policy decides whether
# the memory can be handed to TensorFlow as it is.

class _OutputError(ValueError):
    """A result that does not match the op's declaration (InvalidArgument)."""


class _UnsupportedOutput(_OutputError):
    """A result TensorFlow has no tensor for: a structured or datetime array, a
    dict, an arbitrary object.  TF's numpy_function reports these as INTERNAL
    ("Unsupported numpy data type" / "Unsupported object type"); so do we,
    with TF's phrase in the message.  (py_function: InvalidArgument, as TF.)"""


cdef bint _has_tf_dtype(object dt):
    """Whether TensorFlow has a dtype for NumPy dtype `dt` (strings included)."""
    kind = dt.kind
    if dt.names is not None or kind in "Mm":
        return False
    if kind == "V":  # plain bytes, except the ml_dtypes types (bfloat16, ...)
        return dt.type.__module__.startswith("ml_dtypes")
    if kind in "fc":
        return dt.itemsize <= (8 if kind == "f" else 16)  # no long double
    return True


cdef int _raise_unsupported_object(object value, int index) except -1:
    name = type(value).__name__
    raise _UnsupportedOutput(
        f"output {index}: the function returned a {name}, which has no tensor form "
        f"(Unsupported object type {name}); return an ndarray, a NumPy scalar, a "
        f"Python number or string, or a list of them")


cdef int _check_count(object result, int num_outputs) except -1:
    """Raises unless `result` holds one value per declared output."""
    if isinstance(result, (list, tuple)):
        count = len(result)
    elif result is None and num_outputs == 0:
        return 0
    else:
        count = 1
    if count == num_outputs:
        return 0
    noun = "output" if num_outputs == 1 else "outputs"
    if num_outputs == 0:
        hint = "return None (Tout=[] declares no outputs)"
    elif isinstance(result, (list, tuple)):
        hint = ("a list or tuple stands for one value per output; wrap a list "
                "meant as one array in np.asarray(...)")
    else:
        hint = "return one value per declared output, as a list or tuple"
    raise _OutputError(
        f"the function returned {count} value(s) but Tout declares "
        f"{num_outputs} {noun}; {hint}")


cdef str _declared_shape(const PfbOutputSpec* spec):
    dims = ["None" if spec.dims[i] < 0 else str(spec.dims[i]) for i in range(spec.ndim)]
    if spec.ndim == 1:
        return f"({dims[0]},)"
    return "(" + ", ".join(dims) + ")"


cdef int _check_shape(cnp.ndarray arr, const PfbOutputSpec* spec, int index) except -1:
    # npy_intp and int64_t are the same size on the 64-bit platforms TF runs on.
    return _check_dims(arr.ndim, <const int64_t*>cnp.PyArray_DIMS(arr), spec, index, "an array")


cdef int _check_dims(int ndim, const int64_t* shape, const PfbOutputSpec* spec, int index,
                     str what) except -1:
    if spec.ndim < 0:
        return 0
    cdef int i
    cdef bint ok = ndim == spec.ndim
    if ok:
        for i in range(spec.ndim):
            if spec.dims[i] >= 0 and spec.dims[i] != shape[i]:
                ok = False
                break
    if not ok:
        got = tuple([shape[i] for i in range(ndim)])
        raise _OutputError(
            f"output {index}: Tout declares shape {_declared_shape(spec)} but the "
            f"function returned {what} of shape {got}; return an array "
            f"of the declared shape, or relax the TensorSpec (None marks a dimension "
            f"of any size)")
    return 0


# Python values convert to a declared dtype of the same or a wider kind.
_KIND_RANK = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}


cdef cnp.ndarray _coerce(object value, cnp.dtype want, int index):
    """Python scalars and (nested) lists -> an ndarray of the declared dtype."""
    natural = np.asarray(value)
    have_rank = _KIND_RANK.get(natural.dtype.kind, 99)
    if have_rank > _KIND_RANK.get((<object>want).kind, -1):
        raise _OutputError(
            f"output {index}: Tout declares {want.name} but the function returned "
            f"{type(value).__name__} values of kind {natural.dtype.name}, which do not "
            f"convert to {want.name} without loss; return "
            f"np.asarray(value, dtype=np.{want.name}) if that is intended")
    try:
        return np.asarray(value, dtype=want)
    except OverflowError as exc:
        raise _OutputError(f"output {index}: {exc} (declared dtype {want.name})") from None


cdef object _getweakrefcount = weakref.getweakrefcount


cdef bint _weakly_referenced(PyObject* obj):
    """Whether a weak reference (which can hand the object out again) exists."""
    cdef Py_ssize_t offset = (<PyTypeWeaklist*>Py_TYPE(obj)).tp_weaklistoffset
    if offset > 0:
        return (<PyObject**>(<char*>obj + offset))[0] != NULL
    return offset != 0 and _getweakrefcount(<object>obj) > 0


cdef object _layout_reason(PyArrayObject* arr):
    """Why TF cannot take this array's memory as laid out (None: it can)."""
    if not PyArray_IS_C_CONTIGUOUS(arr):
        return "non_contiguous"
    if <uintptr_t>PyArray_DATA(arr) % ALIGNMENT != 0:
        return "unaligned"
    return None


# Why an output cannot be handed over as it is (None: it can).
cdef object _copy_reason(PyObject* obj, Py_ssize_t outside_refs, int copy_mode):
    """Decides zero-copy for an ndarray that `outside_refs` references besides
    the bridge's own keep it alive.

    Runs on borrowed pointers so that no reference taken here skews the counts.
    Zero-copy is safe when nothing in Python can write the memory after the
    call: every array on the base chain is referenced (strongly, and not
    weakly) only by its successor, and the chain ends at an array that owns
    its data (a fresh array or a private view of one), or at a read-only input
    view (TF memory that nobody can write).
    """
    if copy_mode == PFB_COPY_TRUE:
        return "copy_requested"
    cdef PyArrayObject* arr = <PyArrayObject*>obj
    cdef PyObject* last = obj
    cdef bint exclusive = outside_refs == 0 and not _weakly_referenced(obj)
    cdef PyObject* base = PyArray_BASE(arr)
    while base != NULL and PyArray_Check(base):
        if Py_REFCNT(base) != 1 or _weakly_referenced(base):
            exclusive = False
        last = base
        base = PyArray_BASE(<PyArrayObject*>base)
    if base != NULL:
        # A view of memory we did not allocate: safe only for read-only input views.
        exclusive = (Py_TYPE(base) == <PyTypeObject*>_DLPackOwner
                     and not (<_DLPackOwner>base).writable)
    elif not (PyArray_FLAGS(<PyArrayObject*>last) & NPY_ARRAY_OWNDATA):
        exclusive = False  # foreign memory wrapped without an owner
    if not exclusive:
        return "aliasing"
    return _layout_reason(arr)


_COPY_REASON_TEXT = {
    "aliasing": "its memory is still reachable from Python after the call (a global, "
                "a closure, an attribute or another view of it), so Python could change "
                "the tensor later",
    "non_contiguous": "it is not C-contiguous (a strided or transposed view)",
    "unaligned": "its data is not 64-byte aligned, which TensorFlow needs to share it",
}


cdef int _raise_copy_forbidden(int index, str reason) except -1:
    raise _OutputError(
        f"output {index} would need a copy because "
        f"{_COPY_REASON_TEXT[reason]}; copy=False forbids copies. Return a "
        f"fresh, C-contiguous array (e.g. np.ascontiguousarray(x) or x.copy()), "
        f"or use copy=None to let the bridge copy once")


cdef DLManagedTensorVersioned* _export_output(PyObject* raw, Py_ssize_t outside_refs,
                                              int index, const PfbOutputSpec* spec,
                                              int copy_mode, _CallCounts* counts) except NULL:
    """One result -> a DLPack tensor for the kernel.

    `raw` is borrowed; `outside_refs` counts the references to it that the
    bridge does not hold (computed by the caller before any local reference).
    `counts` (NULL: statistics off) receives the bytes, copied or not.
    """
    cdef DLManagedTensorVersioned* exported
    if _is_string_dtype(spec.dtype):
        arr = _as_string_array(<object>raw, index)
        _check_shape(arr, spec, index)
        exported = _export_strings(arr)
        if counts != NULL:
            _count_string_records(counts, exported)
        return exported

    cdef cnp.dtype want = _numpy_dtype(spec.dtype)
    reason = converted = None
    if PyArray_Check(raw):
        # Decided before any local reference to the array exists.
        if PyArray_SIZE(<PyArrayObject*>raw) > 0:
            reason = _copy_reason(raw, outside_refs, copy_mode)
        arr = <object>raw
    else:
        value = <object>raw
        if isinstance(value, np.generic):
            arr = np.asarray(value)  # fresh; its dtype must match
        elif isinstance(value, (bool, int, float, complex, list, tuple)):
            arr = _coerce(value, want, index)  # fresh
            converted = "dtype_conversion"
        else:
            arr = np.asarray(value)  # an object exporting an array: memory not ours
            if arr.dtype.kind == "O":
                _raise_unsupported_object(value, index)  # a dict, an arbitrary object
            reason = "aliasing"
        if copy_mode == PFB_COPY_TRUE:
            reason = "copy_requested"
        elif reason is None and arr.size > 0:
            reason = _layout_reason(<PyArrayObject*>arr)

    cdef cnp.ndarray checked = arr
    if checked.descr is not want and checked.dtype != want:
        if not _has_tf_dtype(checked.dtype):
            raise _UnsupportedOutput(
                f"output {index}: the function returned an array of dtype "
                f"{checked.dtype}, which TensorFlow has no dtype for (Unsupported "
                f"numpy data type); return an array of the declared dtype {want.name}")
        got = arr.dtype.name
        if got == want.name:  # same kind and size: another byte order
            got = f"{got} with byte order {arr.dtype.str!r}"
        raise _OutputError(
            f"output {index}: Tout declares {want.name} but the function returned an "
            f"array of dtype {got}; return arr.astype(np.{want.name}) or "
            f"declare Tout={'tf.' + arr.dtype.name if arr.dtype.kind != 'O' else '...'}")
    _check_shape(checked, spec, index)
    if reason is not None:
        if copy_mode == PFB_COPY_FALSE:
            _raise_copy_forbidden(index, reason)
        checked = np.array(checked, order="C", copy=True)
    if counts != NULL:
        _count_bytes(counts, reason if reason is not None else converted,
                     cnp.PyArray_NBYTES(checked))
    return _export_array(checked, spec.dtype)
