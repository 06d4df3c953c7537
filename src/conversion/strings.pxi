# tf.string results: object arrays of bytes -> records (pointer, size) that
# point into the bytes objects they keep alive.  (Records -> bytes is the
# string case of _view, dlpack.pxi; str and 'S'/'U' results are made bytes by
# _as_string_array, outputs.pxi.)

cdef DLManagedTensorVersioned* _export_strings(cnp.ndarray arr) except NULL:
    """Records pointing into the bytes objects that `arr` keeps alive."""
    cdef Py_ssize_t n = arr.size, i
    cdef PfbStringRef* records = <PfbStringRef*>malloc(max(n, 1) * sizeof(PfbStringRef))
    if records == NULL:
        raise MemoryError("cannot allocate string records")
    cdef bytes item
    flat = arr.reshape(-1)
    for i in range(n):
        item = flat[i]
        records[i].data = <const char*>item
        records[i].size = len(item)
    cdef DLDataType dtype
    dtype.code = PFB_STRING_DTYPE_CODE
    dtype.bits = PFB_STRING_DTYPE_BITS
    dtype.lanes = 1
    try:
        holder = _StringRecords.__new__(_StringRecords)
        (<_StringRecords>holder).records = records
        (<_StringRecords>holder).items = arr
    except BaseException:
        free(records)
        raise
    return _export(holder, dtype, arr.ndim, <npy_intp*>cnp.PyArray_DIMS(arr), NULL,
                   sizeof(PfbStringRef), records, DLPACK_FLAG_BITMASK_IS_COPIED)


cdef class _StringRecords:
    """Keeps string records and the bytes they point into alive."""
    cdef PfbStringRef* records
    cdef object items

    def __dealloc__(self):
        free(self.records)
