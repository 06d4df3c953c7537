# Calls that run in a worker process (executor=, pyfunc_bridge/pool/process_pool.py):
# the converter the driver calls for them, and the results that stay in the
# worker's shared memory.  The pool does the traffic (ProcessPool.ring_call,
# or the kernel's native call); this file hands it the call's inputs, records
# the call's trace events, and hands the pool's decoder (ProcessPool.decode)
# worker_result, which turns a result block into an ndarray that the usual
# checks and copy decision (_export_outputs) take: the pool never calls up.


cdef class _ResultBlock:
    """A block of a worker's result arena, kept by the output that views it;
    when the output goes, the block is handed back to the worker (with the
    dispatcher's next message to it)."""
    # The dispatcher's reference on the arena (the pool module's NativeArena).
    cdef object arena
    # The uint8 array over the worker's result mapping: keeps the mapping
    # alive for as long as the block is viewed, after the pool let go of it
    # (closed, or the worker died).
    cdef object results
    cdef Py_ssize_t offset

    def __dealloc__(self):
        if self.arena is not None:
            try:
                self.arena.hand_back(self.offset)
            except BaseException:
                pass  # the interpreter is finalizing: the memory goes with it


def worker_result(object native_arena, cnp.ndarray results, Py_ssize_t offset, Py_ssize_t size,
                  object dtype, tuple shape):
    """A read-only ndarray of `dtype` and `shape` over a block of a worker's
    result arena (`native_arena`, the pool module's NativeArena, which takes the
    block back; `results`, a uint8 array over its mapping).  Its base is a
    read-only bridge owner of the block (the worker wrote it, and nothing in
    Python can write it): the copy decision hands it to TensorFlow without a
    copy, and the tensor keeps the block, and with it the mapping.  The
    pool's decoder of a DONE (src/pool/reply_decode.h) checked the block:
    aligned, inside the arena, and holding `shape` of `dtype`."""
    cdef cnp.dtype descr = np.dtype(dtype)
    cdef int ndim = len(shape)
    cdef npy_intp dims[64]
    cdef int i
    if ndim > 64:
        raise ValueError(f"a worker result has {ndim} dimensions; at most 64 are supported")
    for i in range(ndim):
        dims[i] = shape[i]
    cdef char* data = <char*>cnp.PyArray_DATA(results) + offset
    cdef _ResultBlock block = _ResultBlock.__new__(_ResultBlock)
    block.arena = native_arena
    block.results = results
    block.offset = offset
    cdef DLDataType u8 = DLDataType(kDLUInt, 8, 1)
    cdef npy_intp length = size
    cdef _DLPackOwner owner = _adopt_checked(_export(block, u8, 1, &length, NULL, 1, data, 0))
    owner.shared = True  # viewed: never handed out as it is
    Py_INCREF(descr)  # PyArray_NewFromDescr steals a reference to descr
    arr = <object>PyArray_NewFromDescr(<PyTypeObject*>np.ndarray, <PyArray_Descr*>descr,
                                       ndim, dims, NULL, data, 0, NULL)
    Py_XDECREF(<PyObject*>arr)  # the cast above took a second reference
    cnp.set_array_base(arr, owner)  # the view keeps the block
    return arr


cdef class _PoolResult:
    """What a pool call's call() hands its outputs(): the result, and per
    value the reason copy=False refuses it for (None: none), decided by the
    one copy decision (_copy_reason) on the facts the worker sent of what the
    function returned, before the worker copied it."""
    cdef object value
    cdef list refused


cdef class _ProcessConverter(_NumpyConverter):
    """Calls run by a ProcessPool: the inputs go to shared memory (one copy),
    the function runs in a worker, and its results come back as views of the
    worker's shared memory (no copy, _export_outputs decides as for any
    result) or as pickled values.  Waiting for the worker releases the GIL,
    so TF's threads keep many calls in flight."""
    cdef readonly object pool        # a ProcessPool, or the default pool's stand-in
    cdef readonly object framework   # array_function's framework name; None: NumPy

    cdef list inputs(self, PfbCall* call, tuple args, _CallCounts* counts):
        # Read-only views suffice: the worker's copy is the call's own (call()
        # counts it).
        _input_arrays(args, PFB_COPY_FALSE, self.scalars, NULL)
        return None

    cdef object call(self, PfbCall* call, object entry, tuple args, _CallCounts* counts):
        # The worker's inputs are the call's own copies: the function may write
        # them, as in-process it may write what is the call's alone.
        cdef bint writable = call.copy_mode != PFB_COPY_FALSE
        cdef bint copied = call.copy_mode == PFB_COPY_TRUE
        if call.reply != NULL:
            # The kernel ran it natively; its reply's result blocks are ours.
            address = <uintptr_t>call.reply
            call.reply = NULL
            result, moved, facts = self.pool.decode(address, copied, worker_result)
        else:
            if counts != NULL:  # numbers: to shared memory
                _count_inputs(counts, args, &counts.copied[_WORKER])
            facts = call.copy_mode == PFB_COPY_FALSE  # the worker sends its copy facts
            queued = trace_now()  # 0 unless a profiler records
            # A route per statistics record: its native calls count there only.
            record = _record_of(entry)
            route, reply, pid = self.pool.ring_call(entry.func, self.framework, args, writable,
                                                    self.scalars, facts, record)
            _count_route(record, route)  # its pool figures: pfb.stats() reads them
            # Before the decoding, which may raise the function's error.
            trace_worker(queued, reply.message.stamp, reply.message.ended, pid)
            result, moved, facts = self.pool.decode(reply, copied, worker_result)
            reply = None  # its blocks not viewed go back now
            if call.route != NULL and call.route[0] == NULL:
                # Later calls of this kernel go without Python, on the same
                # route (under copy=False their results carry the worker's
                # copy facts, and the kernel hands a result it would refuse
                # back here).
                call.route[0] = <void*><uintptr_t>route.share()
        if counts != NULL:
            counts.copied[_WORKER] += moved
        if not self.scalars and self.framework is None:
            flat = _flat_mapping(result)
            if flat is not result:  # a mapping came pickled: fresh, no copy facts
                result, facts = flat, [None] * len(flat)
        cdef _PoolResult made = _PoolResult.__new__(_PoolResult)
        made.value = result
        if call.copy_mode == PFB_COPY_FALSE:
            made.refused = [None if f is None else _copy_reason(PFB_COPY_FALSE, False, f[0],
                                                                f[1], f[2], f[3])
                            for f in facts]
        else:
            made.refused = [None] * len(facts)
        return made

    cdef int outputs(self, PfbCall* call, object result, Py_ssize_t outside_refs,
                     list ranges, _CallCounts* counts) except -1:
        cdef _PoolResult pooled = <_PoolResult?>result
        value = pooled.value
        pooled.value = None  # the references to `value` are now its own and ours
        return _export_outputs(call, value, Py_REFCNT(<PyObject*>value) - 1, False, None,
                               counts, pooled.refused, _converts(self, call))


def process_converter(object adapter, bint eager, object pool):
    """The converter of an entry whose calls run in `pool` (a ProcessPool or
    the default pool's stand-in): 0-d inputs as NumPy's converter hands them
    over (_NUMPY / _NUMPY_EAGER), or as arrays for array_function."""
    cdef _ProcessConverter made = _ProcessConverter.__new__(_ProcessConverter)
    made.pool = pool
    made.framework = adapter.name if adapter is not None else None
    made.scalars = adapter is None and not eager
    return made
