"""pyfunc_bridge: Python functions as TensorFlow graph ops, fast and safe.

Drop-in replacements for ``tf.numpy_function`` and ``tf.compat.v1.py_func``
built on the project's own op kernel and a Cython DLPack bridge:

>>> import numpy as np, tensorflow as tf
>>> import pyfunc_bridge as pfb
>>> @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
... def f(x):
...     y = pfb.numpy_function(np.sinh, [x], tf.float32)
...     return y * y
>>> float(f(tf.constant(1.0)))  # doctest: +ELLIPSIS
1.381097...

Importing registers the ops, so graphs that name them (SavedModels, imported
GraphDefs, tf.data service jobs) load and run; the conversion module, any
framework and the process pool load on first use.
"""
from pyfunc_bridge import _library

_library.check_tensorflow_version()
_library.register()  # registers the ops with TensorFlow

from pyfunc_bridge._numpy_function import numpy_function, py_func  # noqa: E402
from pyfunc_bridge._py_function import py_function  # noqa: E402
# TensorFlow's own second name for py_function (script_ops.eager_py_func, TF1's
# tf.contrib.eager.py_func): code written against it ports by changing the module.
eager_py_func = py_function
from pyfunc_bridge._array_function import array_function  # noqa: E402
from pyfunc_bridge._stats import enable_stats, reset_stats, stats  # noqa: E402
from pyfunc_bridge._portable import portable, trust_pickled  # noqa: E402
# Above the APIs: it rebuilds loaded py_function ops as _py_function builds
# them.  The conversion layer calls it on a registry miss (graphs from
# elsewhere); imported here so that no kernel thread imports it.
from pyfunc_bridge import _resolve  # noqa: E402,F401

__version__ = "0.1.0"
# The conversion API lives in the conversion layer (src/conversion/dlpack_api.pxi),
# which is imported on first access; so is the pool (pyfunc_bridge.pool, the
# worker package, cloudpickle), which executor= also imports on first use.
_CONVERSION_API = ("from_dlpack", "to_dlpack", "to_numpy", "from_numpy")
# The pool's errors (pyfunc_bridge/pool/errors.py), lazily as the pool.
_POOL_ERRORS = ("WorkerError", "CallTimeoutError", "PoolClosedError")
__all__ = ["numpy_function", "py_func", "py_function", "eager_py_func", "array_function",
           "stats", "reset_stats", "enable_stats", "portable", "trust_pickled", "ProcessPool",
           *_POOL_ERRORS, *_CONVERSION_API]


def __getattr__(name):
    if name == "_conversion":
        # The kernel imports the conversion layer by attribute
        # (PyCapsule_Import) when it runs a graph from elsewhere before any
        # op was built here: load it as first use does.
        return _library.conversion()
    if name in _CONVERSION_API:
        function = getattr(_library.conversion(), name)
        globals()[name] = function  # later lookups skip this hook
        return function
    if name == "ProcessPool":
        from pyfunc_bridge.pool.process_pool import ProcessPool
        globals()[name] = ProcessPool
        return ProcessPool
    if name in _POOL_ERRORS:
        from pyfunc_bridge.pool import errors
        globals()[name] = error = getattr(errors, name)
        return error
    raise AttributeError(f"module 'pyfunc_bridge' has no attribute {name!r}")


def __dir__():
    # The lazy names too (dir() and completion show them), without loading them.
    return sorted({*globals(), "ProcessPool", *_POOL_ERRORS, *_CONVERSION_API})
