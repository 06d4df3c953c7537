"""Loading of the compiled layers: the op library and the conversion module.

Both load lazily, on the first op that is built or run, so that
``import pyfunc_bridge`` costs little beyond ``import tensorflow``.
"""
import os
import threading

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_ops = None


def _major_minor(version):
    return tuple(version.split(".")[:2])


def check_tensorflow_version():
    """Raises ImportError unless the installed TensorFlow is the one we built for."""
    try:
        from pyfunc_bridge._build_config import TF_VERSION
    except ImportError:
        raise ImportError(
            "pyfunc_bridge is not built: install it with `pip install .` (or "
            "`pip install -e .` in a checkout)") from None
    if _major_minor(tf.__version__) != _major_minor(TF_VERSION):
        raise ImportError(
            f"pyfunc_bridge was built for TensorFlow {TF_VERSION} but TensorFlow "
            f"{tf.__version__} is installed; install tensorflow-cpu=={TF_VERSION} "
            f"or rebuild pyfunc_bridge against this TensorFlow "
            f"(pip install --force-reinstall --no-build-isolation pyfunc_bridge)")


def ops():
    """The loaded op library (its generated op wrappers), loading it once."""
    global _ops
    if _ops is None:
        with _lock:
            if _ops is None:
                path = os.path.join(_HERE, "_kernels.so")
                if not os.path.exists(path):
                    raise ImportError(
                        f"pyfunc_bridge's op library is missing ({path}); reinstall "
                        f"pyfunc_bridge")
                # Import the conversion layer first so that a broken build fails
                # here, not inside the first kernel call.
                from pyfunc_bridge import _conversion  # noqa: F401
                _ops = tf.load_op_library(path)
    return _ops


_conversion = None


def conversion():
    """The Cython conversion module (imported on first use)."""
    global _conversion
    if _conversion is None:
        from pyfunc_bridge import _conversion as module
        _conversion = module
    return _conversion
