"""Framework adapters of ``array_function``: how arrays of torch, JAX, ...
cross the bridge.  Each framework is imported only when an op is built for it.

The adapter protocol is documented once, on :class:`Adapter`.
"""
import operator
import threading


class Adapter:
    """The adapter protocol: how one framework's arrays cross the bridge.

    An adapter is stored as ``Entry.framework`` (None for NumPy) and read by
    the conversion layer (src/conversion/frameworks.pxi and converters.pxi).
    The whole interface:

    ``name``
        the framework's name, as given to ``array_function(framework=...)``.
    ``package``
        what to ``pip install`` when the import fails.
    ``modules``
        top-level module names of the framework's array types; results of these
        types are judged by this adapter, whichever framework the op was built for.
    ``load()``
        imports the framework (called at graph construction).
    ``mutable``
        whether a function can write the framework's arrays in place: then,
        under copy=None, an input whose memory TensorFlow shares is handed over
        as a private copy (an immutable framework's never needs one).
    ``wrap_input(owner, copy)``
        one input as the framework's array.  ``owner`` is a DLPack exporter
        (``__dlpack__(*, stream, max_version, dl_device, copy)`` and
        ``__dlpack_device__()``) over TensorFlow's memory, consumable once:
        read-only, or flagged IS_COPIED where it is the call's alone (then the
        function may write it); ``copy=True`` asks for a private writable copy
        (``owner.__dlpack__(copy=True)`` makes one without consuming the owner).
    ``check_inputs(args)``
        after a call under copy=False: may raise when the function wrote to an
        input that its framework could not make read-only.
    ``writable_elsewhere(obj, outside_refs)``
        whether Python could still write result ``obj``'s memory after the call
        (``outside_refs``: references the bridge does not hold).  True makes the
        bridge copy the result (or fail under copy=False).
    ``to_capsule(obj)``
        a DLPack capsule (either kind) of a CPU result, or None to let the bridge
        call ``obj.__dlpack__``; a fast path where the framework's protocol is slow.
    ``resolve(obj)`` (optional)
        a result whose memory does not hold the values it reads as (torch's lazy
        conjugate and negative views) -> a new tensor with the values, else None.
        The bridge exports the new tensor instead; that copy is judged by the copy
        decision like any other (statistics reason ``lazy_view``; under copy=False
        an error).  An adapter whose arrays have no such views leaves it out, and
        the bridge then never calls it.

    Results exporting ``__dlpack__`` and ``tf.Tensor`` results are imported by the
    conversion layer itself; an adapter does not convert outputs.

    This base class gives the defaults: no input check; results of unknown
    provenance are copied.
    """

    name = None
    package = None
    modules = ()
    mutable = True

    def __init__(self):
        self._loaded = False
        self._lock = threading.Lock()

    def load(self):
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            try:
                self._import()
            except ImportError as exc:
                raise ImportError(
                    f"pfb.array_function(framework={self.name!r}) needs the "
                    f"{self.package!r} package, which could not be imported ({exc}); "
                    f"install it with `pip install {self.package}`") from exc
            self._loaded = True

    def _import(self):
        raise NotImplementedError

    def wrap_input(self, owner, copy):
        raise NotImplementedError

    def check_inputs(self, args):
        return None

    def writable_elsewhere(self, obj, outside_refs):
        return True

    def to_capsule(self, obj):
        return None

    def __repr__(self):
        return f"<pyfunc_bridge {self.name} adapter>"


class TorchAdapter(Adapter):
    """torch tensors (CPU).  Inputs follow the input policy: zero-copy over
    memory that is the call's alone, private copies of memory TensorFlow
    shares.  Under copy=False they are zero-copy tensors over TensorFlow's
    memory, and since torch has no read-only tensors an in-place write to
    one (seen through torch's version counter) fails the op."""

    name = "torch"
    package = "torch"
    modules = ("torch",)

    def _import(self):
        import torch
        self._tensor = torch.Tensor
        self._from_dlpack = torch.from_dlpack
        self._use_count = torch._C._storage_Use_Count
        self._to_dlpack = torch.utils.dlpack.to_dlpack

    def wrap_input(self, owner, copy):
        return self._from_dlpack(owner.__dlpack__(max_version=(1, 0), copy=copy or None))

    def check_inputs(self, args):
        for i, a in enumerate(args):
            if isinstance(a, self._tensor) and a._version != 0:
                raise ValueError(
                    f"the function wrote to input {i} in place; under copy=False it is a "
                    f"torch tensor over TensorFlow's memory, which must not change (torch "
                    f"tensors cannot be read-only, so the write already happened). Use "
                    f"copy=None (the default) to receive inputs the function may write, "
                    f"or clone() the input")

    def writable_elsewhere(self, t, outside_refs):
        self.load()  # a torch result of an op built for another framework
        if outside_refs > 0 or not isinstance(t, self._tensor) or t._base is not None:
            return True
        storage = t.untyped_storage()
        # This tensor and the `storage` object made here hold it; more means
        # another tensor (a view, a parameter) shares the memory.
        if self._use_count(storage._cdata) > 2:
            return True
        # Memory torch did not allocate (from_numpy, DLPack) has another owner.
        return not storage.resizable()

    def resolve(self, t):
        # A conjugate / negative view shares memory holding the unconjugated,
        # unnegated values; DLPack has no flag for either, and to_dlpack does
        # not refuse them (Tensor.__dlpack__ does), so they are materialized.
        self.load()
        if isinstance(t, self._tensor) and (t.is_conj() or t.is_neg()):
            return t.resolve_conj().resolve_neg()
        return None

    def to_capsule(self, t):
        # torch.utils.dlpack.to_dlpack (C) instead of Tensor.__dlpack__ (Python,
        # ~8 us with __dlpack_device__); device tensors take the generic path.
        self.load()
        if isinstance(t, self._tensor) and t.is_cpu and not t.requires_grad:
            return self._to_dlpack(t)
        return None


class JaxAdapter(Adapter):
    """JAX arrays.  They are immutable, so results never need a copy for
    safety.  jax.dlpack.from_dlpack shares 64-byte aligned CPU memory (as
    TensorFlow's is) and copies other memory (jax 0.10)."""

    name = "jax"
    package = "jax"
    mutable = False
    modules = ("jax", "jaxlib")

    def _import(self):
        import jax.dlpack
        import numpy
        self._from_dlpack = jax.dlpack.from_dlpack
        self._array = jax.Array
        self._asarray = numpy.asarray

    def to_capsule(self, a):
        # NumPy's view of a CPU array (no copy), not JAX's own export: jaxlib
        # lets go of what that export holds only at its next garbage
        # collection, so a result that is an input would keep XLA's buffer
        # in use after an XLA call, which then fails.
        # (NumPy exports no ml_dtypes type, bfloat16 above all: JAX's export does.)
        self.load()
        if isinstance(a, self._array) and a.__dlpack_device__()[0] == 1:  # kDLCPU
            view = self._asarray(a)
            if view.dtype.isbuiltin == 1:  # (2: a registered type such as ml_dtypes.bfloat16)
                return view.__dlpack__(max_version=(1, 0))
        return None

    def wrap_input(self, owner, copy):
        dtype = owner.dtype
        array = self._from_dlpack(owner, copy=True if copy else None)
        if array.dtype != dtype:
            # Without jax_enable_x64, JAX turns 64-bit inputs into 32-bit ones.
            raise TypeError(
                f"JAX converted a {dtype} input to {array.dtype}, losing range or "
                f"precision; enable 64-bit types with "
                f"jax.config.update('jax_enable_x64', True) or cast the input first")
        return array

    def writable_elsewhere(self, obj, outside_refs):
        return False  # jax.Array is immutable


class _LegacyExporter:
    """`owner` exporting legacy capsules only (no READ_ONLY flag, which some
    consumers refuse), the consumer's stream passed through."""

    def __init__(self, owner, copy):
        self._owner, self._copy = owner, copy

    def __dlpack_device__(self):
        return self._owner.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._owner.__dlpack__(stream=stream, copy=self._copy)


class CupyAdapter(Adapter):
    """CuPy arrays (GPU only: CuPy cannot hold host memory).  Inputs follow
    the input policy (zero-copy where the memory is the call's alone, private
    copies where TensorFlow shares it); under copy=False they are zero-copy
    arrays over TensorFlow's device memory, and since CuPy has neither
    read-only arrays nor a write counter, writing to one is a bug the bridge
    cannot see."""

    name = "cupy"
    package = "cupy-cuda12x"
    modules = ("cupy", "cupyx")

    def _import(self):
        import cupy
        self._ndarray = cupy.ndarray
        self._from_dlpack = cupy.from_dlpack

    def wrap_input(self, owner, copy):
        device_type, device_id = owner.__dlpack_device__()
        if device_type != 2:  # kDLCUDA
            raise TypeError(
                f"pfb.array_function(framework='cupy') got an input in host memory "
                f"(DLPack device {device_type}:{device_id}): this op runs on "
                f"TensorFlow's CPU kernel and CuPy holds only GPU memory; place the op "
                f"on a GPU (with tf.device('/GPU:0'))")
        return self._from_dlpack(_LegacyExporter(owner, copy or None))

    def writable_elsewhere(self, a, outside_refs):
        self.load()
        # A fresh array owns its memory; a view (base) shares someone else's.
        return outside_refs > 0 or not isinstance(a, self._ndarray) or a.base is not None


def not_exported(value, index, reason, want=None):
    """The error text of result `index`, `value`, that pyfunc_bridge cannot
    hand to TensorFlow (`reason`: why, its dtype above all; `want`: the
    declared dtype's name, where the caller knows it).  One text, in this
    process (frameworks.pxi) and in a pool's workers (worker/values.py).

    >>> import numpy as np
    >>> not_exported(np.zeros(1, np.float16), 0, "no such dtype")  # doctest: +ELLIPSIS
    'output 0: the function returned a ndarray of dtype float16, ... its declared Tout ...'
    """
    dtype = getattr(value, "dtype", None)
    to = (f"Tout declares {want}: convert the result to {want}" if want
          else "convert the result to its declared Tout")
    return (f"output {index}: the function returned a {type(value).__name__}"
            f"{'' if dtype is None else f' of dtype {dtype}'}, which pyfunc_bridge cannot "
            f"hand to TensorFlow ({reason}); {to} before returning it")


class ResultError(ValueError):
    """A framework result that cannot be handed to TensorFlow as it is
    (result_capsule's refusals); the conversion layer raises its text as a
    result that does not match the op's declaration.  `reason`: why the
    adapter's export refused it (not_exported's), else None."""

    def __init__(self, text, reason=None):
        super().__init__(text)
        self.reason = reason


def resolved(adapter, value):
    """(what the bridge exports for result `value`, whether that is a lazy
    view's resolved copy): `adapter`'s resolve (torch's conjugate and negative
    views), or `value` itself.  One rule, in this process (frameworks.pxi,
    _export_dlpack_output) and in a pool's workers (worker/values.py,
    worker/memory.py)."""
    resolve = getattr(adapter, "resolve", None)
    if resolve is not None:
        made = resolve(value)
        if made is not None:
            return made, True
    return value, False


def dlpack_device(value):
    """``value.__dlpack_device__()``, checked: a (device_type, device_id) pair of ints."""
    device = value.__dlpack_device__()
    try:
        if isinstance(device, tuple) and len(device) == 2:
            return (operator.index(device[0]), operator.index(device[1]))
    except TypeError:
        pass
    raise BufferError(
        f"{type(value).__name__}.__dlpack_device__() returned {device!r:.80}; the DLPack "
        f"protocol requires a (device_type, device_id) tuple of two ints")


def result_capsule(to_capsule, value, index, on_host=True):
    """The DLPack capsule of result `value` (output `index`) that its
    adapter's `to_capsule` makes, or None: then ``value.__dlpack__`` exports
    it.  Raises ResultError, with the one text in this process
    (frameworks.pxi) and in a pool's workers (worker/values.py), where the
    adapter's export refuses it (torch's bit types) or where it is in device
    memory and the op (`on_host`) reads host memory."""
    try:
        capsule = to_capsule(value)
    except BufferError as exc:
        raise ResultError(not_exported(value, index, exc), exc) from None
    if capsule is None and on_host:
        device_type, device_id = dlpack_device(value)
        if device_type != 1:  # kDLCPU
            raise ResultError(
                f"output {index} is a {type(value).__name__} in device memory (DLPack device "
                f"{device_type}:{device_id}); this op runs on TensorFlow's CPU kernel, "
                f"which reads host memory; return a CPU array (e.g. tensor.cpu())")
    return capsule


# Registered with the conversion layer when it loads (frameworks.pxi).
ADAPTERS = {"torch": TorchAdapter(), "jax": JaxAdapter(), "cupy": CupyAdapter()}


def adapter(framework):
    """The loaded adapter for `framework` (None for "numpy")."""
    if framework == "numpy":
        return None
    found = ADAPTERS.get(framework) if isinstance(framework, str) else None
    if found is None:
        names = ", ".join(repr(n) for n in ["numpy", *ADAPTERS])
        raise ValueError(f"framework must be one of {names}, got {framework!r}")
    found.load()
    return found
