# The public conversion API (re-exported by pyfunc_bridge): TensorFlow tensors
# <-> DLPack producers and NumPy arrays, zero-copy where the memory allows.

cdef object _tensor_from_owner(_DLPackOwner owner, object copy, bint writable_elsewhere,
                               str api, bint lazy=False):
    """An EagerTensor of the owner's memory: zero-copy, or one aligned copy.
    `lazy`: the owner holds a lazy view's resolved copy (see _copy_reason)."""
    cdef DLTensor* t = _owner_tensor(owner)
    cdef int copy_mode = (<tuple>_COPY_POLICIES[copy])[1]
    cdef bint on_host = t.device.device_type == kDLCPU
    if not on_host and copy is True:
        raise BufferError(f"{api}: copy=True of device memory is not supported; "
                          f"copy it with TensorFlow after the import")
    # Device memory is shared as it is: only its being a resolved copy counts.
    reason = (_dl_copy_reason(t, copy_mode, writable_elsewhere, lazy) if on_host
              else _copy_reason(copy_mode, _dl_empty(t), False, True, True, lazy))
    if reason is not None and copy is False:
        raise BufferError(
            f"{api} would need a copy because {_COPY_REASON_TEXT[reason]}; copy=False "
            f"forbids copies (use copy=None to copy once)")
    if not on_host:
        return _tf_tensor(owner)
    if (reason is not None and _copy_needed(reason)) or _dl_empty(t):
        owner = _adopt_checked(_private_copy(owner))  # empty: TF wants a real pointer
    return _tf_tensor(owner)


def from_dlpack(obj, *, copy=None):
    """A ``tf.Tensor`` from any DLPack producer or capsule.

    ``obj`` is an object with ``__dlpack__``/``__dlpack_device__`` (NumPy,
    torch, JAX, CuPy, a ``tf.Tensor``, ``pfb.to_dlpack``'s exporter) or a raw
    capsule of either kind (``"dltensor"``, ``"dltensor_versioned"``).  The
    tensor shares the producer's memory when it is 64-byte aligned and
    compact row-major; otherwise it is copied once.  ``copy=True`` always
    copies; ``copy=False`` never does (BufferError saying why).  Malformed
    tensors and consumed capsules are a BufferError.  A CUDA producer is
    asked with TensorFlow's compute stream on its device
    (``__dlpack__(stream=...)``), so that work it queued on its own streams is
    done before TensorFlow's next op reads the memory.

    >>> import numpy as np
    >>> from pyfunc_bridge._conversion import aligned_allocation
    >>> with aligned_allocation():
    ...     a = np.arange(6.0).reshape(2, 3)
    >>> t = from_dlpack(a)
    >>> t.shape, t.dtype.name
    (TensorShape([2, 3]), 'float64')
    >>> np.shares_memory(to_numpy(t), a)
    True
    >>> from_dlpack(a[:, ::2], copy=False)
    Traceback (most recent call last):
    ...
    BufferError: from_dlpack would need a copy because it is not C-contiguous (a strided or transposed view); copy=False forbids copies (use copy=None to copy once)
    """
    _check_copy(copy)
    cdef bint lazy = False
    if not PyCapsule_CheckExact(obj):
        resolved = _resolved(obj)
        if resolved is not None:
            # torch's lazy conjugate / negative views: their memory does not
            # hold the values, so the resolved copy is imported instead (the
            # copy decision names it: lazy_view).
            obj = resolved
            lazy = True
    cdef DLManagedTensorVersioned* m = _consume(obj, _tf_has_gpu())
    return _tensor_from_owner(_adopt_checked(m), copy, False, "from_dlpack", lazy)


def from_numpy(array, *, copy=None):
    """A ``tf.Tensor`` from an ndarray, zero-copy when that is safe.

    ``copy=None`` shares the memory only when nothing can write it through
    Python afterwards (a read-only view made by :func:`to_numpy`, an array
    over bytes) and it is 64-byte aligned and C-contiguous; a writable array
    is copied once.  ``copy=False`` shares any aligned, C-contiguous array
    (do not write to it while the tensor lives) and is a BufferError
    otherwise; ``copy=True`` always copies.  String arrays (``S``, ``U``,
    object) become ``tf.string`` tensors, always by conversion.

    >>> import numpy as np, tensorflow as tf
    >>> t = tf.constant([1.0, 2.0])
    >>> view = to_numpy(t)             # read-only, TensorFlow's memory
    >>> u = from_numpy(view)           # back to TensorFlow without a copy
    >>> np.shares_memory(to_numpy(u), view)
    True
    >>> a = np.arange(3)
    >>> np.shares_memory(to_numpy(from_numpy(a)), a)   # writable: copied
    False
    """
    _check_copy(copy)
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"from_numpy takes an ndarray, got {type(array).__name__}; use "
            f"pfb.from_dlpack for other DLPack producers")
    kind = array.dtype.kind
    if kind in "OSUT":  # T: NumPy 2's StringDType
        _load_tf()
        return _tf_convert(array, _tf_string)
    # copy=False shares any array: the caller vouches that nobody writes it.
    cdef bint writable_elsewhere = copy is None and not _readonly_memory(array)
    cdef bint bf16 = array.dtype == _BFLOAT16
    # NumPy exports only its builtin dtypes: bfloat16 travels as uint16.
    cdef DLManagedTensorVersioned* m = _consume(array.view(np.uint16) if bf16 else array,
                                                False)
    if bf16:
        m.dl_tensor.dtype.code = kDLBfloat
    return _tensor_from_owner(_adopt_checked(m), copy, writable_elsewhere, "from_numpy")


def to_dlpack(tensor, *, copy=None):
    """A DLPack exporter of an eager ``tf.Tensor``'s memory.

    The result implements the full protocol: ``__dlpack__(*, stream=None,
    max_version=None, dl_device=None, copy=None)`` and
    ``__dlpack_device__()``.  Consumers asking with ``max_version >= (1, 0)``
    get a versioned capsule flagged ``READ_ONLY`` (TensorFlow's memory must
    not be written), others a legacy one; bool is exported as ``kDLBool``.
    It can be consumed once, like a capsule.  ``copy=True`` exports a private
    writable copy flagged ``IS_COPIED``.

    >>> import numpy as np, tensorflow as tf
    >>> t = tf.constant([True, False])
    >>> a = np.from_dlpack(to_dlpack(t))
    >>> a, a.flags.writeable
    (array([ True, False]), False)
    >>> np.shares_memory(a, to_numpy(t))
    True
    """
    _check_copy(copy)
    _check_tensor_arg(tensor, "to_dlpack")
    return _tf_export(tensor, copy)


def to_numpy(tensor, *, copy=None):
    """An ndarray of an eager ``tf.Tensor``: a read-only zero-copy view by default.

    ``copy=True`` gives a private writable copy.  ``copy=False`` insists on
    the view (BufferError for device memory).  ``tf.string`` tensors become
    object arrays of bytes (always converted).

    >>> import tensorflow as tf
    >>> v = to_numpy(tf.constant([[1, 2], [3, 4]]))
    >>> v, v.flags.writeable
    (array([[1, 2],
           [3, 4]], dtype=int32), False)
    >>> to_numpy(tf.constant([1, 2]), copy=True).flags.writeable
    True
    """
    _check_copy(copy)
    _check_tensor_arg(tensor, "to_numpy")
    if tensor._datatype_enum() == PFB_TF_DT_STRING:
        return tensor.numpy()
    cdef _DLPackOwner owner = _tf_export(tensor, None)
    cdef DLTensor* t = _owner_tensor(owner)
    if t.device.device_type != kDLCPU:
        if copy is False:
            raise BufferError(
                f"to_numpy(copy=False): the tensor is on device {_device_name(t.device)}; "
                f"NumPy arrays live in host memory")
        return tensor.numpy()
    if copy is True:
        owner = _adopt_checked(_private_copy(owner))
        return _view(owner, True)
    return _view(owner, False)
