# The conversion layer's one dtype table: each dtype that crosses the bridge as
# TensorFlow (DataType enum of types.proto, name), DLPack and NumPy spell it.
# Every other dtype fact of this layer and of the op layer (Tout names,
# pyfunc_bridge/_tout.py) is derived from it.  The kernel has its own table
# (src/kernel/inputs.cc, ToDLDataType): one per language boundary.

cdef enum:
    TF_DT_STRING = 7   # named: EagerTensor._datatype_enum() is compared with them
    TF_DT_BOOL = 10

_DTYPES = (  # (TF enum, name, DLPack code, bits, NumPy), two per line
    (1, "float32", kDLFloat, 32, np.float32),      (2, "float64", kDLFloat, 64, np.float64),
    (19, "float16", kDLFloat, 16, np.float16),     (14, "bfloat16", kDLBfloat, 16, ml_dtypes.bfloat16),
    (6, "int8", kDLInt, 8, np.int8),               (5, "int16", kDLInt, 16, np.int16),
    (3, "int32", kDLInt, 32, np.int32),            (9, "int64", kDLInt, 64, np.int64),
    (4, "uint8", kDLUInt, 8, np.uint8),            (17, "uint16", kDLUInt, 16, np.uint16),
    (22, "uint32", kDLUInt, 32, np.uint32),        (23, "uint64", kDLUInt, 64, np.uint64),
    (TF_DT_BOOL, "bool", kDLBool, 8, np.bool_),    (8, "complex64", kDLComplex, 64, np.complex64),
    (18, "complex128", kDLComplex, 128, np.complex128),
    (TF_DT_STRING, "string", PFB_STRING_DTYPE_CODE, PFB_STRING_DTYPE_BITS, object),
)

# The names of the supported dtypes (the op layer's Tout and input check).
DTYPE_NAMES = tuple([row[1] for row in _DTYPES])

cdef cnp.dtype _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Lookups derived from the table: C arrays, so that the per-call conversions
# allocate nothing.  NumPy dtypes by [DLPack code][bits / 8] (borrowed from
# _numpy_dtypes); DLPack dtypes by TF enum.
cdef enum:
    _NUM_CODES = 8
    _NUM_SIZES = 17    # bits / 8 up to 128
    _NUM_TF_ENUMS = 24
cdef list _numpy_dtypes = []
cdef PyObject* _numpy_by_dl[_NUM_CODES][_NUM_SIZES]
cdef DLDataType _dl_by_tf[_NUM_TF_ENUMS]
cdef bint _tf_known[_NUM_TF_ENUMS]

memset(_numpy_by_dl, 0, sizeof(_numpy_by_dl))
memset(_tf_known, 0, sizeof(_tf_known))
for _tf_enum, _name, _code, _bits, _numpy in _DTYPES:
    _descr = np.dtype(_numpy)
    _numpy_dtypes.append(_descr)  # keeps the borrowed pointer below alive
    _numpy_by_dl[<int>_code][<int>_bits // 8] = <PyObject*>_descr
    _dl_by_tf[<int>_tf_enum].code = _code
    _dl_by_tf[<int>_tf_enum].bits = _bits
    _dl_by_tf[<int>_tf_enum].lanes = 1
    _tf_known[<int>_tf_enum] = True


cdef bint _is_string_dtype(DLDataType dt) noexcept nogil:
    return dt.code == PFB_STRING_DTYPE_CODE and dt.bits == PFB_STRING_DTYPE_BITS and dt.lanes == 1


cdef object _unsupported_dtype(str message):
    """The BufferError of a DLPack dtype outside the table, marked, so that a
    function's result says so in its own words (frameworks.pxi)."""
    exc = BufferError(message)
    exc.unsupported_dtype = True
    return exc


cdef cnp.dtype _numpy_dtype(DLDataType dt):
    """The NumPy dtype of a DLPack dtype (object for strings), or BufferError."""
    cdef PyObject* found = NULL
    if dt.lanes != 1:
        raise _unsupported_dtype(f"DLPack dtype with {dt.lanes} lanes is not supported")
    if dt.code < _NUM_CODES and dt.bits % 8 == 0 and dt.bits // 8 < _NUM_SIZES:
        found = _numpy_by_dl[dt.code][dt.bits // 8]
    if found == NULL:
        raise _unsupported_dtype(
            f"unsupported DLPack dtype (code {dt.code}, bits {dt.bits})")
    return <cnp.dtype>found


cdef DLDataType _dl_dtype(int tf_enum) except *:
    """The DLPack dtype of a TensorFlow DataType enum, or TypeError."""
    if tf_enum < 0 or tf_enum >= _NUM_TF_ENUMS or not _tf_known[tf_enum]:
        raise TypeError(f"pyfunc_bridge does not support TensorFlow dtype enum {tf_enum}")
    return _dl_by_tf[tf_enum]


cdef str _dtype_name(DLDataType dt):
    """TF-style name of a DLPack dtype, for messages."""
    if _is_string_dtype(dt):
        return "string"
    return _numpy_dtype(dt).name
