"""Framework adapters of ``array_function``: how arrays of torch, JAX, ...
cross the bridge.  Each framework is imported only when an op is built for it.

The adapter protocol is documented once, on :class:`Adapter`.
"""
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
    ``wrap_input(owner, copy)``
        one input as the framework's array.  ``owner`` is a DLPack exporter
        (``__dlpack__(*, stream, max_version, dl_device, copy)`` and
        ``__dlpack_device__()``) over TensorFlow's read-only memory, consumable
        once; ``copy=True`` asks for a private writable copy
        (``owner.__dlpack__(copy=True)`` makes one without consuming the owner).
    ``check_inputs(args)``
        after the call (copy=None/False): may raise when the function wrote to an
        input that its framework could not make read-only.
    ``writable_elsewhere(obj, outside_refs)``
        whether Python could still write result ``obj``'s memory after the call
        (``outside_refs``: references the bridge does not hold).  True makes the
        bridge copy the result (or fail under copy=False).
    ``to_capsule(obj)``
        a DLPack capsule (either kind) of a CPU result, or None to let the bridge
        call ``obj.__dlpack__``; a fast path where the framework's protocol is slow.

    Results exporting ``__dlpack__`` and ``tf.Tensor`` results are imported by the
    conversion layer itself; an adapter does not convert outputs.

    This base class gives the defaults: no input check; results of unknown
    provenance are copied.
    """

    name = None
    package = None
    modules = ()

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
    """torch tensors (CPU).  torch has no read-only tensors: inputs are
    zero-copy tensors over TensorFlow's memory, and an in-place write to one
    (seen through torch's version counter) fails the op."""

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
                    f"the function wrote to input {i} in place; it is a torch tensor "
                    f"over TensorFlow's memory, which must not change (torch tensors "
                    f"cannot be read-only, so the write already happened). Use "
                    f"copy=True to receive private writable copies, or clone() the input")

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

    def to_capsule(self, t):
        # torch.utils.dlpack.to_dlpack (C) instead of Tensor.__dlpack__ (Python,
        # ~8 us with __dlpack_device__); device tensors take the generic path.
        self.load()
        if isinstance(t, self._tensor) and t.is_cpu and not t.requires_grad:
            return self._to_dlpack(t)
        return None


class JaxAdapter(Adapter):
    """JAX arrays (CPU).  They are immutable, so results never need a copy for
    safety.  jax.dlpack.from_dlpack copies CPU memory on import (jax 0.10)."""

    name = "jax"
    package = "jax"
    modules = ("jax", "jaxlib")

    def _import(self):
        import jax.dlpack
        self._from_dlpack = jax.dlpack.from_dlpack

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


# Registered with the conversion layer when it loads (frameworks.pxi).
ADAPTERS = {"torch": TorchAdapter(), "jax": JaxAdapter()}


def adapter(framework):
    """The loaded adapter for `framework` (None for "numpy")."""
    if framework == "numpy":
        return None
    if framework == "cupy":
        raise NotImplementedError(
            "pfb.array_function(framework='cupy') needs the GPU kernel, which is not "
            "built yet: the CPU kernel hands over host memory, which CuPy cannot hold")
    found = ADAPTERS.get(framework) if isinstance(framework, str) else None
    if found is None:
        names = ", ".join(repr(n) for n in ["numpy", *ADAPTERS])
        raise ValueError(f"framework must be one of {names}, got {framework!r}")
    found.load()
    return found
