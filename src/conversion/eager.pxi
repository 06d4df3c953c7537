# Eager calls of numpy_function / py_func / array_function: the same bridge
# call the kernel makes (_run), entered directly instead of through TF's eager
# op dispatch, which costs more than the whole bridge.  Inputs are exported
# from the EagerTensors by DLPack (zero-copy), results come back as
# EagerTensors over the same memory.  Used where TF has a single device (the
# CPU), so that it computes exactly what the CPU kernel would.

# TensorFlow's DataType enum (types.proto) -> DLPack dtype.
cdef dict _TF_DL_DTYPES = {
    1: (kDLFloat, 32), 2: (kDLFloat, 64), 19: (kDLFloat, 16), 14: (kDLBfloat, 16),
    6: (kDLInt, 8), 5: (kDLInt, 16), 3: (kDLInt, 32), 9: (kDLInt, 64),
    4: (kDLUInt, 8), 17: (kDLUInt, 16), 22: (kDLUInt, 32), 23: (kDLUInt, 64),
    10: (kDLBool, 8), 8: (kDLComplex, 64), 18: (kDLComplex, 128),
    TF_DT_STRING: (PFB_STRING_DTYPE_CODE, PFB_STRING_DTYPE_BITS),
}

cdef object _error_types = None


cdef object _tf_error(int code, str message):
    """The TF exception of a status code, as an op would raise it."""
    global _error_types
    if _error_types is None:
        from tensorflow.python.framework import errors
        _error_types = errors.exception_type_from_error_code
    return _error_types(code)(None, None, message)


def direct_eager_calls():
    """Whether eager bridge calls may skip TF's op dispatch (one CPU device)."""
    _load_tf()
    return _sole_device(_tf_context()).endswith(b"CPU:0")


cdef DLManagedTensorVersioned* _export_eager_input(object tensor) except NULL:
    if tensor._datatype_enum() == TF_DT_STRING:
        return _export_strings(tensor.numpy())  # object array of bytes
    cdef _DLPackOwner owner = _tf_export(tensor, None)
    cdef DLManagedTensorVersioned* m = _hand_out(owner)
    owner.managed = NULL  # the call owns it now
    return m


cdef object _eager_output(DLManagedTensorVersioned* m):
    """A result of the call -> an EagerTensor (takes `m`)."""
    cdef _DLPackOwner owner = _adopt_checked(m)
    if _is_string_dtype(m.dl_tensor.dtype):
        return _tf_constant(_view(owner, False))
    return _tf_tensor(owner)


def call_eagerly(list inputs, list dtypes, list shapes, int copy_mode):
    """Runs the function in the eager slot on EagerTensors `inputs` and returns
    its results as EagerTensors; errors are raised as the op would raise them.

    `dtypes`: the declared output dtypes; `shapes`: their declared shapes (or
    an empty list)."""
    _import_tensorflow()
    cdef Py_ssize_t n_in = len(inputs), n_out = len(dtypes), i, j
    cdef DLManagedTensorVersioned** ins = <DLManagedTensorVersioned**>calloc(
        max(n_in, 1), sizeof(void*))
    cdef DLManagedTensorVersioned** outs = <DLManagedTensorVersioned**>calloc(
        max(n_out, 1), sizeof(void*))
    cdef PfbOutputSpec* specs = <PfbOutputSpec*>calloc(max(n_out, 1), sizeof(PfbOutputSpec))
    dims = []  # keeps each spec's dims alive
    cdef cnp.ndarray spec_dims
    cdef PfbCall call
    cdef PfbStatus status
    cdef DLManagedTensorVersioned* m
    results = []
    try:
        if ins == NULL or outs == NULL or specs == NULL:
            raise MemoryError("cannot allocate a bridge call")
        for i in range(n_out):
            code, bits = _TF_DL_DTYPES[dtypes[i].as_datatype_enum]
            specs[i].dtype.code = code
            specs[i].dtype.bits = bits
            specs[i].dtype.lanes = 1
            specs[i].device.device_type = kDLCPU
            specs[i].device.device_id = 0
            specs[i].ndim = -1
            if shapes and shapes[i].rank is not None:
                spec_dims = np.array([-1 if d is None else d for d in shapes[i].as_list()],
                                     dtype=np.int64)
                dims.append(spec_dims)
                specs[i].ndim = shapes[i].rank
                specs[i].dims = <int64_t*>cnp.PyArray_DATA(spec_dims)
        try:
            for i in range(n_in):
                ins[i] = _export_eager_input(inputs[i])
        except BaseException:
            for j in range(i):
                ins[j].deleter(ins[j])
            raise
        call.key = _EAGER_KEY_C
        call.key_len = _EAGER_KEY_LEN
        call.copy_mode = copy_mode
        call.flags = 0
        call.num_inputs = <int32_t>n_in
        call.inputs = ins
        call.num_outputs = <int32_t>n_out
        call.output_specs = specs
        call.outputs = outs
        call.device_name = NULL
        call.stream = NULL
        call.state = NULL
        status.code = 0
        status.message = NULL
        _eager.raised = None
        _bridge_call(&call, &status)  # consumes the inputs
        if status.code != 0:
            raised = take_raised()
            if raised is not None:
                free(status.message)
                raise raised
            message = (status.message[:strlen(status.message)].decode("utf-8", "replace")
                       if status.message != NULL else "(no message)")
            free(status.message)
            raise _tf_error(status.code, message)
        for i in range(n_out):
            m = outs[i]
            outs[i] = NULL
            results.append(_eager_output(m))
        return results
    finally:
        for i in range(n_out):
            if outs != NULL and outs[i] != NULL:
                outs[i].deleter(outs[i])
        free(ins)
        free(outs)
        free(specs)
