"""A worker's values: framework arrays as NumPy and back, strings blocks,
and the framework adapters, loaded without the package."""
import math
import os
import struct

_LENGTH = struct.Struct("<Q")  # a string's length in a strings block (shm_layout.h)
_adapters = None  # top-level module name -> framework adapter
_frameworks = None  # pyfunc_bridge/_frameworks.py, loaded by its path


def framework_adapter(value):
    """The adapter (pyfunc_bridge/_frameworks.py) that judges results of
    `value`'s type, or None."""
    frameworks()
    top = getattr(type(value), "__module__", None)
    return _adapters.get(top.partition(".")[0]) if isinstance(top, str) else None


def frameworks():
    """pyfunc_bridge/_frameworks.py, the rules its functions share with the
    conversion layer (resolved, result_capsule, not_exported, adapter),
    loaded by its path: importing it through the package would import
    TensorFlow."""
    global _adapters, _frameworks
    if _frameworks is None:
        import importlib.util
        package = os.path.dirname(os.path.dirname(__file__))
        spec = importlib.util.spec_from_file_location(
            "_pyfunc_bridge_frameworks", os.path.join(package, "_frameworks.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _adapters = {name: adapter for adapter in module.ADAPTERS.values()
                     for name in adapter.modules}
        _frameworks = module
    return _frameworks


def as_numpy(np, value, framework, index=0):
    """A result (output `index`) as NumPy's (the parent takes NumPy values).
    A framework's array is first what the bridge exports of it in-process,
    refused as there with the same text (_frameworks.py's resolved and
    result_capsule, which frameworks.pxi calls too)."""
    if isinstance(value, (np.ndarray, np.generic)) or not hasattr(type(value), "__dlpack__"):
        return value
    if framework is None:
        return np.from_dlpack(value)
    adapter = framework_adapter(value)
    value, _ = _frameworks.resolved(adapter, value)
    # (No adapter: no export of its own, as an Adapter's to_capsule.)
    capsule = _frameworks.result_capsule(getattr(adapter, "to_capsule", lambda _: None),
                                         value, index)
    try:
        if capsule is not None and type(value).__module__.startswith("torch"):
            return _torch_numpy(np, value)  # (its bfloat16 too)
        if framework == "jax" and hasattr(value, "__array__"):
            return np.asarray(value)  # (ml_dtypes' bfloat16 too)
        # Its own export, as in-process (torch's refuses a tensor that requires grad).
        return np.from_dlpack(value)
    except TypeError as exc:  # a dtype NumPy has none for (complex32, float8)
        raise TypeError(_frameworks.not_exported(value, index, exc)) from None


def _torch_numpy(np, t):
    """t.numpy(), for bfloat16 too (which torch has no NumPy type for: its
    bits are viewed as ml_dtypes.bfloat16, TensorFlow's NumPy type)."""
    import torch
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def wrap_input(np, arr, framework):
    if framework == "torch" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import torch
        if arr.dtype.name == "bfloat16":  # (torch.from_numpy knows no ml_dtypes)
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    if framework == "jax" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import jax.numpy as jnp
        return jnp.asarray(arr)
    return arr


# Results the parent converts itself (_export_output, outputs.pxi): by their
# kind (scalars, lists: to the declared dtype; strings: to tf.string).
CONVERTED_BY_THE_PARENT = (bool, int, float, complex, list, tuple, str, bytes)


def strings_array(np, data, shape):
    """An object array of bytes from a strings block: per element a uint64
    little-endian length, then its bytes (shm_layout.h)."""
    count = math.prod(shape)
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        (n,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if at + n > len(data):
            raise ValueError("pyfunc_bridge: a strings block ends inside an element")
        out[i] = bytes(data[at:at + n])
        at += n
    return out.reshape(shape)

