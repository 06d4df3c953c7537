# Eager calls of numpy_function / py_func / array_function: the same driver
# the kernel calls (_run, bridge.pxi), entered directly instead of through TF's
# eager op dispatch, which costs more than the whole bridge.  Inputs are exported
# from the EagerTensors by DLPack (zero-copy), results come back as
# EagerTensors over the same memory.  Used where TF has a single device (the
# CPU), so that it computes exactly what the CPU kernel would.

cdef object _direct_eager = None  # direct_eager_calls(), once known


def direct_eager_calls():
    """Whether eager bridge calls may skip TF's op dispatch (one CPU device).
    Asked on every eager call; TF's devices are fixed once its context is
    initialized (_sole_device caches them), so the answer is kept."""
    global _direct_eager
    if _direct_eager is None:
        _load_tf()
        _direct_eager = _sole_device(_tf_context()).endswith(b"CPU:0")
    return _direct_eager


cdef DLManagedTensorVersioned* _export_eager_input(object tensor) except NULL:
    if tensor._datatype_enum() == PFB_TF_DT_STRING:
        # An object array of bytes (a 0-d tensor's numpy() is bare bytes).
        return _export_strings(np.asarray(tensor.numpy(), dtype=object))
    return _consume_owner(_tf_export(tensor, None))  # the call owns it now


cdef object _eager_output(DLManagedTensorVersioned* m):
    """A result of the call -> an EagerTensor (takes `m`)."""
    cdef _DLPackOwner owner = _adopt_checked(m)
    if _is_string_dtype(m.dl_tensor.dtype):
        return _tf_constant(_view(owner, False))
    return _tf_tensor(owner)


def call_eagerly(list inputs, list dtypes, list shapes, int copy_mode):
    """Runs the function in this thread's eager slot on EagerTensors `inputs` and returns
    its results as EagerTensors; errors are raised as the op would raise them.

    `dtypes`: the declared output dtypes; `shapes`: their declared shapes (or
    an empty list).  What the kernel does around the driver, done here: the
    output specs, the inputs as DLPack tensors, the PfbCall, and the status."""
    cdef Py_ssize_t n_in = len(inputs), n_out = len(dtypes), i, j
    cdef DLManagedTensorVersioned** ins = <DLManagedTensorVersioned**>calloc(
        max(n_in, 1), sizeof(void*))
    cdef DLManagedTensorVersioned** outs = <DLManagedTensorVersioned**>calloc(
        max(n_out, 1), sizeof(void*))
    cdef PfbOutputSpec* specs = <PfbOutputSpec*>calloc(max(n_out, 1), sizeof(PfbOutputSpec))
    dims = []  # keeps each spec's dims alive
    cdef cnp.ndarray spec_dims
    cdef PfbCall call
    cdef DLManagedTensorVersioned* m
    cdef int code = 0
    cdef _EagerSlot slot = eager_slot()
    call.num_outputs = <int32_t>n_out
    call.outputs = outs
    results = []
    try:
        if ins == NULL or outs == NULL or specs == NULL:
            raise MemoryError("cannot allocate a bridge call")
        _load_tf()
        for i in range(n_out):
            specs[i].dtype = _dl_dtype(dtypes[i].as_datatype_enum)
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
        call.key = slot.key_bytes
        call.key_len = len(slot.key_bytes)
        call.copy_mode = copy_mode
        call.flags = 0
        call.num_inputs = <int32_t>n_in
        call.inputs = ins
        call.output_specs = specs
        call.device_name = NULL
        call.stream = NULL
        call.state = NULL
        # The eager slot always holds the function: no portable description.
        call.reference = NULL
        call.reference_len = 0
        call.pickled = NULL
        call.pickled_len = 0
        call.framework = NULL
        call.framework_len = 0
        call.eager = NULL  # no py_function call comes here
        call.site = NULL  # the eager key names the slot's entry, not one function
        call.node_name = NULL  # no op runs it
        call.node_name_len = 0
        call.route = NULL  # no kernel keeps a route
        call.reply = NULL
        try:
            _run(&call)  # consumes the inputs; frees its outputs on error
        except BaseException as exc:
            # As a kernel's status; what the op layer re-raises in its place
            # stays on this thread (_failure).
            code, message = _failure(&call, exc)
        if code != 0:
            raise _tf_error(code, message)  # outside the handler: no chained context
        for i in range(n_out):
            m = outs[i]
            outs[i] = NULL
            results.append(_eager_output(m))
        return results
    finally:
        if outs != NULL:
            _delete_outputs(&call)
        free(ins)
        free(outs)
        free(specs)
