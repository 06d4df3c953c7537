# Results of the registered function -> DLPack tensors: count, dtype and shape
# checked against what the op declares, then the copy policy decides whether
# the memory can be handed to TensorFlow as it is.

class _OutputError(ValueError):
    """A result that does not match the op's declaration (InvalidArgument)."""


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


# Python values convert to a declared dtype of the same or a wider kind, and
# only when every value is in range (NumPy's rule for Python scalars: an int
# out of bounds is an error, and so is a float that would become inf).
_KIND_RANK = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}
_KIND_WORD = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}
_INF = float("inf")


def _overflow_at(dtype):
    """The smallest Python float that becomes inf in `dtype`, found by bisecting
    the bit patterns above its largest value (the conversion's own rounding,
    which for bfloat16 goes through float32, decides)."""
    import struct
    bits = lambda x: struct.unpack("<q", struct.pack("<d", x))[0]
    value = lambda b: struct.unpack("<d", struct.pack("<q", b))[0]
    finite = bits(float(ml_dtypes.finfo(dtype).max))
    infinite = bits(float(ml_dtypes.finfo(dtype).max) * 2)
    with np.errstate(over="ignore", invalid="ignore"):
        while infinite - finite > 1:
            middle = (finite + infinite) // 2
            if np.isinf(np.asarray(value(middle), dtype=dtype)):
                infinite = middle
            else:
                finite = middle
    return value(infinite)


# Floats narrower than a Python float (complex64: per part): the magnitude at
# which a value overflows to inf.  Keyed by dtype (dtype.name costs microseconds).
_OVERFLOW_AT = {np.dtype(dtype): _overflow_at(part) for dtype, part in [
    (np.float16, np.float16), (_BFLOAT16, _BFLOAT16), (np.float32, np.float32),
    (np.complex64, np.float32)]}


cdef str _short_repr(object value):
    text = repr(value)
    if len(text) > 120:
        return f"{text[:100]}... ({type(value).__name__} of {len(value)} items)" \
            if isinstance(value, (list, tuple)) else f"{text[:100]}..."
    return text


cdef str _leaf_kind(object value, int limit):
    """The widest kind among the Python values in `value` (nested lists),
    stopping at the first one ranked above `limit`."""
    cdef str widest = "b"
    cdef str kind
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
            continue
        if isinstance(item, bool) or isinstance(item, np.bool_):
            kind = "b"
        elif isinstance(item, int):
            kind = "i"
        elif isinstance(item, float):
            kind = "f"
        elif isinstance(item, complex):
            kind = "c"
        elif isinstance(item, np.generic) and item.dtype.kind in _KIND_RANK:
            kind = item.dtype.kind
        else:
            return "O"
        if _KIND_RANK[kind] > _KIND_RANK[widest]:
            widest = kind
            if _KIND_RANK[kind] > limit:
                return kind
    return widest


cdef cnp.ndarray _coerce(object value, cnp.dtype want, int index):
    """Python scalars and (nested) lists -> an ndarray of the declared dtype,
    when that loses nothing: no narrower kind, no value out of range."""
    want_kind = "f" if want is _BFLOAT16 else (<object>want).kind
    cdef int want_rank = _KIND_RANK.get(want_kind, -1)
    natural = np.asarray(value)
    kind = natural.dtype.kind
    if natural.size > 0:  # an empty list has no value to lose
        if kind == "O" or (kind == "f" and want_rank < 2):
            # Ints beyond int64 make NumPy guess float64 or object: ask the values.
            kind = _leaf_kind(value, want_rank)
        if _KIND_RANK.get(kind, 99) > want_rank:
            what = _KIND_WORD.get(kind, "non-numeric")
            raise _OutputError(
                f"output {index}: Tout declares {want.name} but the function returned "
                f"{_short_repr(value)}: {what} values do not convert to {want.name} "
                f"without loss; return an array of dtype {want.name} if that is intended")
    limit = _OVERFLOW_AT.get(want)  # None: no finite Python value overflows
    try:
        if limit is None:
            arr = np.asarray(value, dtype=want)  # ints out of range raise OverflowError
        elif not isinstance(value, (list, tuple)):
            # A scalar (the common case) is judged in Python: errstate and
            # isinf would cost more than the whole conversion.
            c = complex(value)
            if (limit <= abs(c.real) < _INF) or (limit <= abs(c.imag) < _INF):
                raise _OutputError(
                    f"output {index}: Tout declares {want.name} but the function returned "
                    f"{_short_repr(value)}, which overflows {want.name} (it would become inf)")
            arr = np.asarray(value, dtype=want)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                arr = np.asarray(value, dtype=want)
            overflowed = np.isinf(arr)
            if overflowed.any():
                if natural.dtype.kind in "fc":
                    overflowed &= ~np.isinf(natural)  # an inf given stays an inf
                if overflowed.any():
                    raise _OutputError(
                        f"output {index}: Tout declares {want.name} but the function "
                        f"returned {_short_repr(value)}, which overflows {want.name} (it "
                        f"would become inf)")
    except OverflowError as exc:
        raise _OutputError(
            f"output {index}: Tout declares {want.name} but the function returned "
            f"{_short_repr(value)}, which is out of bounds for {want.name} ({exc})") from None
    return arr


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
    "lazy_view": "it is a lazy conjugate or negative view (torch), whose memory does not "
                 "hold its values until it is resolved into a new tensor",
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
            reason = "aliasing"
        if copy_mode == PFB_COPY_TRUE:
            reason = "copy_requested"
        elif reason is None and arr.size > 0:
            reason = _layout_reason(<PyArrayObject*>arr)

    cdef cnp.ndarray checked = arr
    if checked.descr is not want and checked.dtype != want:
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
