# The conversion layer's lookups in the project's one dtype table
# (src/dtype_table.h, shared with the kernel, XLA and the pool's records),
# and the facts of this layer and of the op layer (Tout names,
# pyfunc_bridge/_tout.py) derived from it.  EagerTensor._datatype_enum() is
# compared with PFB_TF_DT_STRING and PFB_TF_DT_BOOL.

# The names of the supported dtypes (the op layer's Tout and input check).
DTYPE_NAMES = tuple([pfb_dtypes[i].name.decode() for i in range(PFB_NUM_DTYPES)]) + ("string",)

cdef cnp.dtype _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
cdef cnp.dtype _OBJECT = np.dtype(object)

# Each row's NumPy dtype, by row (borrowed from _numpy_dtypes), so that the
# per-call conversions allocate nothing.
cdef tuple _numpy_dtypes = tuple([np.dtype(name) for name in DTYPE_NAMES[:PFB_NUM_DTYPES]])
cdef PyObject* _numpy_by_row[PFB_NUM_DTYPES]
for _row, _descr in enumerate(_numpy_dtypes):
    _numpy_by_row[_row] = <PyObject*>_descr


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
    cdef int row
    if dt.lanes != 1:
        raise _unsupported_dtype(f"DLPack dtype with {dt.lanes} lanes is not supported")
    row = pfb_dtype_by_dl(dt.code, dt.bits, dt.lanes)
    if row >= 0:
        return <cnp.dtype>_numpy_by_row[row]
    if _is_string_dtype(dt):
        return _OBJECT
    raise _unsupported_dtype(f"unsupported DLPack dtype (code {dt.code}, bits {dt.bits})")


cdef DLDataType _dl_dtype(int tf_enum) except *:
    """The DLPack dtype of a TensorFlow DataType enum, or TypeError."""
    cdef DLDataType dt
    cdef int row = pfb_dtype_by_tf(tf_enum)
    dt.lanes = 1
    if row >= 0:
        dt.code = pfb_dtypes[row].code
        dt.bits = pfb_dtypes[row].bits
    elif tf_enum == PFB_TF_DT_STRING:
        dt.code = PFB_STRING_DTYPE_CODE
        dt.bits = PFB_STRING_DTYPE_BITS
    else:
        raise TypeError(f"pyfunc_bridge does not support TensorFlow dtype enum {tf_enum}")
    return dt


cdef str _dtype_name(DLDataType dt):
    """TF-style name of a DLPack dtype, for messages."""
    if _is_string_dtype(dt):
        return "string"
    return _numpy_dtype(dt).name
