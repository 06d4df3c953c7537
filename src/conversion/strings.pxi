# tf.string: records (pointer, size) from the kernel -> object array of bytes;
# bytes / str / object / 'S' / 'U' arrays and lists -> records, UTF-8 for str.

cdef object _strings_from_records(DLTensor* t):
    shape = tuple([t.shape[i] for i in range(t.ndim)])
    cdef cnp.ndarray out = np.empty(shape, dtype=object)
    cdef Py_ssize_t n = out.size, i
    cdef const PfbStringRef* records = <const PfbStringRef*>(<char*>t.data + t.byte_offset)
    flat = out.reshape(-1)
    for i in range(n):
        flat[i] = records[i].data[:records[i].size]
    return out


cdef cnp.ndarray _as_string_array(object value, int index):
    """An object ndarray of bytes for a string output (str is UTF-8 encoded)."""
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind not in "OSU":
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
        _raise_unsupported_object(value, index)  # a dict, an arbitrary object
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
            raise _OutputError(
                f"output {index}: Tout declares string but element {i} (flat index) "
                f"is {type(item).__name__}; string outputs hold bytes or str")
        i += 1
    return out


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
