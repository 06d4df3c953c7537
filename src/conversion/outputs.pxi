# Results of a NumPy function -> DLPack tensors: count, dtype and shape checked
# against what the op declares, then the copy decision (copy.pxi) says whether
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


# NumPy dtype -> the name of its tf.DType, for the dtypes the bridge supports
# (the dtype table's rows): the only ones a message may tell the user to declare.
_TF_NAME = {descr: descr.name for descr in _numpy_dtypes}


cdef str _numpy_spelling(object dt):
    """How user code names NumPy dtype `dt`: np.float32, ml_dtypes.bfloat16."""
    if dt.kind == "b":
        return "np.bool_"  # np.bool is NumPy 2's only
    module = "ml_dtypes" if dt.type.__module__.startswith("ml_dtypes") else "np"
    return f"{module}.{dt.name}"


cdef str _dtype_text(object dt):
    """A NumPy dtype as a message shows it: U3 (str), not str96."""
    if dt.kind == "U":
        return f"U{dt.itemsize // 4} (str)"
    if dt.kind == "S":
        return f"S{dt.itemsize} (bytes)"
    if not dt.isnative:
        return f"{dt.name} with byte order {dt.str!r}"
    return dt.name


cdef str _returned_text(object value, object dt):
    """What the function returned, for a dtype mismatch: the array, or the
    value NumPy made an array of."""
    if isinstance(value, np.ndarray):
        return f"an array of dtype {_dtype_text(dt)}"
    if isinstance(value, np.generic):
        return f"{_short_repr(value)}, a NumPy scalar of dtype {_dtype_text(dt)}"
    name = dt.str[1:] if dt.kind in "SU" else _dtype_text(dt)  # the type says str or bytes
    return (f"{_short_repr(value)} ({type(value).__name__}, which NumPy reads as an "
            f"array of dtype {name})")


cdef str _dtype_fix(object value, object got, object want):
    """The fixes for `value`, of NumPy dtype `got`, where Tout declares `want`:
    the conversion, and the Tout to declare where the bridge has a TF dtype
    for `got` (never one that does not exist, as tf.str64 or np.bfloat16)."""
    if isinstance(value, (np.ndarray, np.generic)):
        convert = f"return value.astype({_numpy_spelling(want)})"
    else:
        convert = f"return np.asarray(value, dtype={_numpy_spelling(want)})"
    if got.kind in "SUT":  # T: NumPy 2's StringDType
        return f"{convert} if it holds numbers as text, or declare Tout=tf.string"
    if got.kind == "O":
        return (f"{convert} if it holds numbers, or declare Tout=tf.string if it "
                f"holds bytes or str")
    # Another byte order is refused under any Tout: only the conversion helps.
    declared = _TF_NAME.get(got) if got.isnative else None
    if declared is None:
        return convert
    return f"{convert} or declare Tout=tf.{declared}"


cdef int _raise_unsupported_item(cnp.ndarray arr, str text) except -1:
    """Raises `text` as _UnsupportedOutput where object array `arr` holds an
    item that is neither bytes nor str: TensorFlow has no tensor of it
    (INTERNAL, "Unsupported object type float"), where an array of strings
    for a numeric Tout is only a wrong dtype (InvalidArgument)."""
    if arr.dtype.kind != "O":
        return 0
    for item in arr.reshape(-1):
        if not isinstance(item, (bytes, str)):
            raise _UnsupportedOutput(
                f"{text} (Unsupported object type {type(item).__name__})")
    return 0


cdef int _raise_unsupported_object(object value, int index) except -1:
    name = type(value).__name__
    raise _UnsupportedOutput(
        f"output {index}: the function returned a {name}, which has no tensor form "
        f"(Unsupported object type {name}); return an ndarray, a NumPy scalar, a "
        f"Python number or string, or a list of them")


cdef int _check_count(object result, int num_outputs, str as_one) except -1:
    """Raises unless `result` holds one value per declared output: the one
    output-count check.  `as_one` completes "wrap a list meant as one ..."."""
    if isinstance(result, (list, tuple)):
        count = len(result)
    elif result is None:
        count = 0  # TF: "returns 0 values" (a None result is no value, not one)
    else:
        count = 1
    if count == num_outputs:
        return 0
    noun = "output" if num_outputs == 1 else "outputs"
    if num_outputs == 0:
        hint = "return None (Tout=[] declares no outputs)"
    elif result is None:
        raise _OutputError(
            f"the function returned None (0 values) but Tout declares {num_outputs} "
            f"{noun}; return {'a value' if num_outputs == 1 else 'one value per output'} "
            f"(a function without a return statement returns None), or declare Tout=[]")
    elif isinstance(result, (list, tuple)):
        hint = ("a list or tuple stands for one value per output; wrap a list "
                f"meant as one {as_one}")
    else:
        hint = "return one value per declared output, as a list or tuple"
    raise _OutputError(
        f"the function returned {count} value(s) but Tout declares "
        f"{num_outputs} {noun}; {hint}")


# The wrap hints of _check_count.
cdef str _ONE_ARRAY = "array in np.asarray(...)"
cdef str _ONE_TENSOR = "tensor in tf.constant(...)"


def check_count(result, int num_outputs):
    """The output-count check for the op layer (py_function's structured results)."""
    _check_count(result, num_outputs, _ONE_TENSOR)


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


cdef str _number_kind(object dt):
    """The kind of a numeric NumPy dtype ("b", "i", "u", "f", "c"; ml_dtypes'
    floats are "f"), or "" for any other."""
    kind = dt.kind
    if kind == "V" and dt.type.__module__.startswith("ml_dtypes"):
        return "f"
    return kind if kind in "biufc" else ""


cdef object _converted(cnp.ndarray arr, cnp.dtype want, int index, object raw):
    """A py_function result `arr` of another numeric dtype, as `want`, where no
    value changes (TF's convert_to_tensor converts it even where one does):
    the one rule on which such conversions happen.  Converted: any safe cast
    (np.can_cast), ints to ints in range, ints to floats held exactly, and
    floats (complex) narrowed, rounded as astype rounds, unless a finite value
    would become inf.  Out of range, inexact or overflowing: an _OutputError
    naming the value.  None: no conversion (floats to ints, to bool, complex
    to real): the caller's dtype error."""
    got = arr.dtype
    src, dst = _number_kind(got), _number_kind(want)
    if not src or not dst or not got.isnative:
        return None
    if np.can_cast(got, want, "safe"):
        return _aligned_copy(arr, want)
    bad = None
    if src in "iu" and dst in "iu":
        info = np.iinfo(want)
        bad = (arr < info.min) | (arr > info.max)
        why = f"which is out of range for {want.name} ({info.min} to {info.max})"
    elif src in "iu" and dst == "f":
        # Exact where the odd part of |value| fits the significand and the
        # value stays below the largest finite one.
        finfo = ml_dtypes.finfo(want)
        magnitude = np.abs(arr.astype(np.int64)).view(np.uint64) if src == "i" else arr.astype(np.uint64)
        lowest_bit = magnitude & (~magnitude + np.uint64(1))
        odd = magnitude // np.maximum(lowest_bit, np.uint64(1))
        bad = (odd >= np.uint64(2 ** (finfo.nmant + 1))) | (magnitude > float(finfo.max))
        why = f"which {want.name} cannot hold exactly"
    elif src in "fc" and dst == src or (src == "f" and dst == "c"):
        with np.errstate(over="ignore", invalid="ignore"):
            made = _aligned_copy(arr, want)
        bad = np.isinf(made) & np.isfinite(arr)
        why = f"which overflows {want.name} (it would become inf)"
        if not bad.any():
            return made
    else:
        return None
    if bad.any():
        what = _returned_text(raw, got)
        if not isinstance(raw, np.generic):  # (a NumPy scalar's text shows its value)
            value = arr.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]].item()
            what = f"{what} holding {value!r}"
        raise _OutputError(
            f"output {index}: Tout declares {want.name} but the function returned "
            f"{what}, {why}; {_dtype_fix(raw, got, want)}")
    return _aligned_copy(arr, want)


cdef cnp.ndarray _as_string_array(object value, int index):
    """An object ndarray of bytes for a string output (str is UTF-8 encoded)."""
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        # T: NumPy 2's StringDType, whose items are str (TF's py_function takes it).
        if kind not in "OSUT":
            if not _has_tf_dtype(value.dtype):  # structured, datetime, raw bytes: as TF
                raise _UnsupportedOutput(
                    f"output {index}: the function returned an array of dtype "
                    f"{value.dtype}, which TensorFlow has no dtype for (Unsupported "
                    f"numpy data type); return bytes, str or an array of them")
            raise _OutputError(
                f"output {index}: Tout declares string but the function returned an "
                f"ndarray of dtype {value.dtype}; return bytes, str or an array of them")
        source = value
    elif isinstance(value, (bytes, str, np.generic)):
        source = np.array(value, dtype=object)
    elif isinstance(value, (list, tuple)):
        source = np.array(value, dtype=object)
    elif isinstance(value, (bool, int, float, complex)):
        raise _OutputError(
            f"output {index}: Tout declares string but the function returned "
            f"{type(value).__name__}; return bytes, str, a list of them or an ndarray of them")
    else:
        # As TF's numpy_function: what NumPy makes of it (a bytearray or a
        # memoryview is an array of uint8, a wrong dtype: InvalidArgument).
        source = np.asarray(value)
        if source.dtype.kind == "O" and source.ndim == 0 and source[()] is value:
            _raise_unsupported_object(value, index)  # a dict, an arbitrary object
        if source.dtype.kind not in "OSUT":
            name = type(value).__name__
            fix = ("bytes(value) for one string, or value.decode() for text"
                   if isinstance(value, bytearray) or (
                       isinstance(value, memoryview) and value.format in ("B", "b", "c"))
                   else "bytes, str or an array of them")
            raise _OutputError(
                f"output {index}: Tout declares string but the function returned a "
                f"{name}, which NumPy reads as an array of {source.dtype}, not as "
                f"strings; return {fix}")
    cdef cnp.ndarray out = np.empty(source.shape, dtype=object)
    flat_out = out.reshape(-1)
    cdef Py_ssize_t i = 0
    for item in source.reshape(-1):
        if type(item) is bytes:
            flat_out[i] = item
        elif isinstance(item, bytes):
            flat_out[i] = bytes(item)  # np.bytes_ and other subclasses
        elif isinstance(item, str):
            flat_out[i] = (<str>item).encode("utf-8")
        else:
            raise _UnsupportedOutput(
                f"output {index}: Tout declares string but element {i} (flat index) "
                f"is {type(item).__name__}, which has no tensor form (Unsupported "
                f"object type {type(item).__name__}); string outputs hold bytes or str")
        i += 1
    return out


cdef int _raise_copy_forbidden(int index, str reason) except -1:
    raise _OutputError(
        f"output {index} would need a copy because "
        f"{_COPY_REASON_TEXT[reason]}; copy=False forbids copies. Return a "
        f"fresh, C-contiguous array (e.g. np.ascontiguousarray(x) or x.copy()), "
        f"or use copy=None to let the bridge copy once")


cdef DLManagedTensorVersioned* _export_output(PyObject* raw, Py_ssize_t outside_refs,
                                              int index, const PfbOutputSpec* spec,
                                              int copy_mode, _CallCounts* counts,
                                              bint sole=False, bint pooled=False,
                                              object refused=None,
                                              bint convert=False) except NULL:
    """One result -> a DLPack tensor for the kernel.

    `raw` is borrowed; `outside_refs` counts the references to it that the
    bridge does not hold (computed by the caller before any local reference).
    `counts` (NULL: statistics off) receives the bytes, copied or not.
    `sole`: `raw` is the function's whole result (one output): the one case
    where a view of an input may be given back (_input_given_back), since no
    other output can be a second export of the same view.
    `pooled`: `raw` is a worker process's result as the pool made it (a view
    of its shared memory, or unpickled): copy=False judges what the function
    returned instead, `refused` (the reason the copy decision gave on the
    worker's facts, or None), and a copy the pool's own array needs (an
    unpickled array may be unaligned) is the transport's, made under any policy.
    `convert`: a NumPy value of another numeric dtype converts where no value
    changes (_converted; py_function, as TF converts its results).
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
    converted = None
    cdef bint foreign = False
    if PyArray_Check(raw):
        # Decided before any local reference to the array exists.
        foreign = _array_writable_elsewhere(raw, outside_refs)
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
            foreign = True
    reason = _array_copy_reason(<PyArrayObject*>arr, copy_mode, foreign)

    cdef cnp.ndarray checked = arr
    if checked.descr is not want and checked.dtype != want and convert:
        made = _converted(checked, want, index, <object>raw)
        if made is not None:
            checked = made  # fresh: nothing else refers to it
            reason = _array_copy_reason(<PyArrayObject*>checked, copy_mode, False)
            converted = "dtype_conversion"
    if checked.descr is not want and checked.dtype != want:
        if not _has_tf_dtype(checked.dtype):
            raise _UnsupportedOutput(
                f"output {index}: the function returned an array of dtype "
                f"{checked.dtype}, which TensorFlow has no dtype for (Unsupported "
                f"numpy data type); return an array of the declared dtype {want.name}")
        text = (f"output {index}: Tout declares {want.name} but the function returned "
                f"{_returned_text(<object>raw, arr.dtype)}; {_dtype_fix(<object>raw, arr.dtype, want)}")
        _raise_unsupported_item(checked, text)
        raise _OutputError(text)
    _check_shape(checked, spec, index)
    if pooled and refused is not None and copy_mode == PFB_COPY_FALSE:
        _raise_copy_forbidden(index, refused)
    cdef DLManagedTensorVersioned* given
    if sole and reason is None and PyArray_Check(raw):  # the result itself, an ndarray
        given = _input_given_back(raw, outside_refs, spec)
        if given != NULL:
            if counts != NULL:
                counts.zero_copy += cnp.PyArray_NBYTES(checked)
            return given
    if reason is not None:
        if copy_mode == PFB_COPY_FALSE and not pooled:
            _raise_copy_forbidden(index, reason)
        checked = _aligned_copy(checked)
    if counts != NULL:
        _count_bytes(counts, reason if reason is not None else converted,
                     cnp.PyArray_NBYTES(checked))
    # Memory only this export reaches may be written in place by the ops that
    # consume it (the next bridge call's input policy, TF's in-place kernels).
    return _export_array(checked, spec.dtype,
                         reason is not None or (not foreign and not pooled
                                                and _owned_memory(<PyObject*>checked)))
