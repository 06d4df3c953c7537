# DLPack dtype <-> NumPy dtype.  The one table in each direction.

cdef cnp.dtype _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
cdef cnp.dtype _OBJECT = np.dtype(object)

cdef bint _is_string_dtype(DLDataType dt) noexcept nogil:
    return dt.code == PFB_STRING_DTYPE_CODE and dt.bits == PFB_STRING_DTYPE_BITS and dt.lanes == 1


cdef cnp.dtype _numpy_dtype(DLDataType dt):
    """The NumPy dtype of a DLPack dtype, or BufferError."""
    cdef int bits = dt.bits
    cdef int typenum = -1
    if dt.lanes != 1:
        raise BufferError(f"DLPack dtype with {dt.lanes} lanes is not supported")
    if dt.code == kDLFloat:
        typenum = (cnp.NPY_FLOAT16 if bits == 16 else cnp.NPY_FLOAT if bits == 32
                   else cnp.NPY_DOUBLE if bits == 64 else -1)
    elif dt.code == kDLInt:
        typenum = (cnp.NPY_INT8 if bits == 8 else cnp.NPY_INT16 if bits == 16
                   else cnp.NPY_INT32 if bits == 32 else cnp.NPY_INT64 if bits == 64 else -1)
    elif dt.code == kDLUInt:
        typenum = (cnp.NPY_UINT8 if bits == 8 else cnp.NPY_UINT16 if bits == 16
                   else cnp.NPY_UINT32 if bits == 32 else cnp.NPY_UINT64 if bits == 64 else -1)
    elif dt.code == kDLComplex:
        typenum = (cnp.NPY_COMPLEX64 if bits == 64 else cnp.NPY_COMPLEX128 if bits == 128
                   else -1)
    elif dt.code == kDLBool:
        typenum = cnp.NPY_BOOL if bits == 8 else -1
    elif dt.code == kDLBfloat:
        if bits == 16:
            return _BFLOAT16
    elif _is_string_dtype(dt):
        return _OBJECT
    if typenum < 0:
        raise BufferError(
            f"unsupported DLPack dtype (code {dt.code}, bits {dt.bits})")
    return cnp.PyArray_DescrFromType(typenum)


cdef str _dtype_name(DLDataType dt):
    """TF-style name of a DLPack dtype, for messages."""
    if _is_string_dtype(dt):
        return "string"
    return _numpy_dtype(dt).name
