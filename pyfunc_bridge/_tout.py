"""Normalization of ``Tout``: dtypes, TensorSpecs (declared shapes), lists."""
import collections

import tensorflow as tf

from pyfunc_bridge import _library

_supported_dtypes = None


def supported_dtypes():
    """The dtypes that cross the bridge: the project's dtype table
    (src/dtype_table.h), through the conversion layer (loaded on the first op)."""
    global _supported_dtypes
    if _supported_dtypes is None:
        _supported_dtypes = frozenset(
            tf.as_dtype(name) for name in _library.conversion().DTYPE_NAMES)
    return _supported_dtypes

OutputSignature = collections.namedtuple(
    "OutputSignature", ["dtypes", "shapes", "single"])
OutputSignature.__doc__ = """Normalized Tout.

dtypes: one tf.DType per output.
shapes: one tf.TensorShape per output, or [] when no output declares a shape.
single: Tout was one dtype/spec (the op returns a tensor, not a list).
"""


def _supported(dtype, what):
    supported = supported_dtypes()
    if dtype not in supported:
        names = ", ".join(sorted(d.name for d in supported))
        raise TypeError(
            f"{what}: pyfunc_bridge does not support dtype {dtype.name}; supported "
            f"dtypes are {names}")
    return dtype


def dtype_of(value, what):
    """A supported tf.DType for `value`, or a TypeError naming `what`."""
    try:
        dtype = tf.as_dtype(value)
    except TypeError as exc:
        # TF's own words first ("Cannot convert ... to a TensorFlow DType."):
        # code matches on them.
        raise TypeError(
            f"{what}: {exc} {what} must be a tf.DType, a NumPy dtype or a "
            f"tf.TensorSpec, got {value!r}") from None
    return _supported(dtype, what)


_caches = {}


def cached(build, Tout):
    """build(Tout), remembered per `build` for hashable Tout (lists by items)."""
    cache = _caches.setdefault(build, {})
    key = (type(Tout), tuple(Tout)) if isinstance(Tout, (list, tuple)) else Tout
    try:
        return cache[key]
    except TypeError:  # unhashable: build every time
        return build(Tout)
    except KeyError:
        pass
    value = build(Tout)
    if len(cache) > 4096:
        cache.clear()
    cache[key] = value
    return value


def normalize(Tout):
    """Tout -> OutputSignature (cached for hashable Tout).

    >>> normalize(tf.float32)
    OutputSignature(dtypes=[tf.float32], shapes=[], single=True)
    >>> normalize([tf.TensorSpec([None, 2], tf.int32), tf.string]).shapes
    [TensorShape([None, 2]), TensorShape(None)]
    """
    return cached(_normalize, Tout)


# TF's words first (code matches on them).
MISSING_TOUT = ("Missing required argument: 'Tout': a dtype, a tf.TensorSpec, or a list of "
                "them ([] for no outputs); a decorator takes it by name, "
                "`@numpy_function(Tout=...)`")


def _normalize(Tout):
    if Tout is None:
        raise TypeError(MISSING_TOUT)
    single = not isinstance(Tout, (list, tuple))
    items = [Tout] if single else list(Tout)
    dtypes, shapes, declared = [], [], False
    for i, item in enumerate(items):
        what = "Tout" if single else f"Tout[{i}]"
        if isinstance(item, tf.TensorSpec):
            dtypes.append(_supported(item.dtype, what))
            shapes.append(item.shape)
            declared = declared or item.shape.rank is not None
        elif isinstance(item, tf.TypeSpec):
            raise TypeError(
                f"{what}: {type(item).__name__} is a composite type spec; "
                f"numpy_function outputs are dense tensors (tf.TensorSpec or a dtype)")
        else:
            dtypes.append(dtype_of(item, what))
            shapes.append(tf.TensorShape(None))
    return OutputSignature(dtypes, shapes if declared else [], single)
