# array_function: inputs as arrays of another framework (torch, JAX, ...)
# through a framework adapter, and results that export __dlpack__ handed to the
# kernel through the validated import, zero-copy when the copy policy allows.
#
# The adapter interface (objects made by pyfunc_bridge/_frameworks.py, stored
# as Entry.framework; None means NumPy and takes the plain NumPy path):
#   adapter.name                          framework name, for messages
#   adapter.modules                       top-level module names of its array
#                                         types (e.g. ("jax", "jaxlib"))
#   adapter.wrap_input(owner, copy)       a _DLPackOwner (full DLPack exporter,
#                                         consumable once) -> the framework's
#                                         array; copy=True: a private copy
#   adapter.check_inputs(args)            after the call, copy=None/False only:
#                                         may raise if the function wrote to an
#                                         input it could not be stopped from writing
#   adapter.writable_elsewhere(obj, outside_refs)
#                                         whether Python could still write the
#                                         memory of result `obj` after the call;
#                                         `outside_refs` counts the references
#                                         the bridge does not hold
#   adapter.to_capsule(obj)               a DLPack capsule of a CPU result, or
#                                         None for the generic obj.__dlpack__
#                                         path (a fast path: torch's Python-level
#                                         protocol costs ~8 us)
# register_framework(adapter) makes the conversion layer judge results of the
# adapter's types with it, whichever framework the op was built for.

cdef dict _adapters_by_module = {}   # top-level module name -> adapter
cdef dict _handlers = {}             # result type -> (writable_elsewhere, to_capsule)


def register_framework(adapter):
    """Judge results whose type lives in ``adapter.modules`` with ``adapter``."""
    for module in adapter.modules:
        _adapters_by_module[module] = adapter
    _handlers.clear()


def _immutable(obj, Py_ssize_t outside_refs):
    return False


def _unknown_memory(obj, Py_ssize_t outside_refs):
    return True  # no framework vouches for it: assume someone can write it


def _no_capsule(obj):
    return None


cdef tuple _handler(object tp):
    """(writable_elsewhere, to_capsule) for results of type `tp`."""
    handler = _handlers.get(tp)
    if handler is None:
        if _is_eager_tensor_type(tp):
            handler = (_immutable, _no_capsule)
        else:
            adapter = _adapters_by_module.get(tp.__module__.partition(".")[0])
            if adapter is None:
                handler = (_unknown_memory, _no_capsule)
            else:
                handler = (adapter.writable_elsewhere,
                           getattr(adapter, "to_capsule", _no_capsule))
        _handlers[tp] = handler
    return <tuple>handler


cdef bint _is_eager_tensor_type(object tp):
    return issubclass(tp, _eager_type())


cdef list _framework_inputs(tuple args, object adapter, int copy_mode):
    """Swaps each owner in `args` for the framework's array (strings: object
    arrays).  Returns the inputs' memory ranges [(start, end), ...]."""
    cdef Py_ssize_t i
    cdef DLTensor* t
    cdef bint private = copy_mode == PFB_COPY_TRUE
    cdef list ranges = []
    wrap = adapter.wrap_input
    for i in range(len(args)):
        owner = <_DLPackOwner>args[i]
        t = _owner_tensor(owner)
        if _is_string_dtype(t.dtype):
            value = _view(owner, False)
        else:
            start = <uintptr_t>t.data + t.byte_offset
            ranges.append((start, start + _nbytes(t)))
            value = wrap(owner, private)
        Py_INCREF(value)  # PyTuple_SET_ITEM steals it
        Py_XDECREF(PyTuple_GET_ITEM(args, i))
        PyTuple_SET_ITEM(args, i, value)
    return ranges


cdef size_t _nbytes(const DLTensor* t) noexcept:
    cdef size_t n = (t.dtype.bits * t.dtype.lanes + 7) // 8
    cdef int i
    for i in range(t.ndim):
        n *= <size_t>t.shape[i]
    return n


cdef bint _inside(const DLTensor* t, list ranges):
    """Whether the tensor lies in an input's memory (TensorFlow's, immutable)."""
    cdef uintptr_t start = <uintptr_t>t.data + t.byte_offset
    cdef uintptr_t end = start + _nbytes(t)
    for lo, hi in ranges:
        if lo <= start and end <= hi:
            return True
    return False


cdef inline bint _same_memory(DLDevice a, DLDevice b) noexcept:
    """Whether memory on device `a` can be an output on device `b`: host memory
    is one address space (TF numbers logical CPUs: CPU:1 exports as kDLCPU id
    1), device memory must be on the op's own device."""
    return a.device_type == b.device_type and (a.device_type == kDLCPU
                                               or a.device_id == b.device_id)


cdef DLManagedTensorVersioned* _export_dlpack_output(
        PyObject* raw, Py_ssize_t outside_refs, int index, const PfbOutputSpec* spec,
        int copy_mode, list ranges, _CallCounts* counts) except NULL:
    """One result of an array_function -> a DLPack tensor for the kernel.

    Objects exporting __dlpack__ go through the validated import: handed over
    as they are when nothing in Python can write the memory afterwards and it
    is aligned and compact, else copied once.  Everything else (ndarrays,
    scalars, lists, strings) takes the NumPy path.
    """
    value = <object>raw
    tp = type(value)
    if (_is_string_dtype(spec.dtype) or PyArray_Check(raw)
            or getattr(tp, "__dlpack__", None) is None or isinstance(value, np.generic)):
        return _export_output(raw, outside_refs, index, spec, copy_mode, counts)
    writable_elsewhere, to_capsule = _handler(tp)
    if copy_mode == PFB_COPY_TRUE:
        reason = "copy_requested"
    elif writable_elsewhere(value, outside_refs):
        reason = "aliasing"
    else:
        reason = None
    capsule = to_capsule(value)
    cdef bint on_host = spec.device.device_type == kDLCPU
    if capsule is None:
        device_type, device_id = value.__dlpack_device__()
        if on_host and device_type != kDLCPU:
            raise _OutputError(
                f"output {index} is a {tp.__name__} in device memory (DLPack device "
                f"{device_type}:{device_id}); this op runs on TensorFlow's CPU kernel, "
                f"which reads host memory; return a CPU array (e.g. tensor.cpu())")
        capsule = value
    cdef _DLPackOwner owner = _adopt_checked(_consume(capsule, not on_host))
    cdef DLTensor* t = &owner.managed.dl_tensor
    if not _same_memory(t.device, spec.device):
        raise _OutputError(
            f"output {index}: the function returned a {tp.__name__} on "
            f"{_device_name(t.device)}, but this output must be on the op's device "
            f"{_device_name(spec.device)}; create it there (tf.device) or copy it")
    if t.dtype.code != spec.dtype.code or t.dtype.bits != spec.dtype.bits:
        raise _OutputError(
            f"output {index}: Tout declares {_dtype_name(spec.dtype)} but the function "
            f"returned a {tp.__name__} of dtype {_dtype_name(t.dtype)}; convert it to "
            f"{_dtype_name(spec.dtype)} or declare Tout=tf.{_dtype_name(t.dtype)}")
    _check_dims(t.ndim, t.shape, spec, index, f"a {tp.__name__}")
    if reason == "aliasing" and _inside(t, ranges):
        reason = None  # a view of an input: TensorFlow's memory, which nobody may write
    if reason is None:
        reason = _dl_layout_reason(t)
    if counts != NULL:
        _count_bytes(counts, reason, _nbytes(t))
    if reason is not None:
        if copy_mode == PFB_COPY_FALSE:
            _raise_copy_forbidden(index, reason)
        return _private_copy(owner)
    cdef DLManagedTensorVersioned* m = _hand_out(owner)
    owner.managed = NULL  # the kernel owns it now
    return m
