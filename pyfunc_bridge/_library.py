"""Loading of the compiled layers: the op library and the conversion module.

Both load lazily, on the first op that is built or run, so that
``import pyfunc_bridge`` costs little beyond ``import tensorflow``.
"""
import atexit
import os
import threading

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_KERNELS = os.path.join(_HERE, "_kernels.so")
_lock = threading.Lock()
_ops = None
_begin_shutdown = None  # the kernel's PyfuncBridge_BeginShutdown, once loaded
# The text of the CancelledError of a bridge call refused at exit (bridge.cc).
_SHUTDOWN_ERROR = "pyfunc_bridge: the Python interpreter is not running"


@atexit.register
def _on_exit():
    """Stops TF's worker threads from entering Python before it finalizes.

    Registered at import, so it runs after the atexit hooks registered later
    (hooks run last-in, first-out): those may still use the bridge.
    """
    if _begin_shutdown is not None:
        _quiet_cancelled_daemon_threads()
        _begin_shutdown()


def _quiet_cancelled_daemon_threads():
    """A daemon thread whose bridge call the exit refused ends silently from
    now on, as Python ends daemon threads at exit, instead of printing the
    CancelledError: its thread was waiting for a TF op when Python exited."""
    previous = threading.excepthook

    def excepthook(args):
        if (args.thread is not None and args.thread.daemon
                and isinstance(args.exc_value, tf.errors.CancelledError)
                and _SHUTDOWN_ERROR in str(args.exc_value)):
            return
        previous(args)
    threading.excepthook = excepthook


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
                if not os.path.exists(_KERNELS):
                    raise ImportError(
                        f"pyfunc_bridge's op library is missing ({_KERNELS}); "
                        f"reinstall pyfunc_bridge")
                # Import the conversion layer first so that a broken build fails
                # here, not inside the first kernel call.
                conversion()
                ops_module = tf.load_op_library(_KERNELS)
                _set_shutdown_hook()
                _ops = ops_module
    return _ops


def _set_shutdown_hook():
    import ctypes
    global _begin_shutdown
    # The library TF just loaded (dlopen hands back the same handle); PyDLL
    # keeps the GIL held across the call, as the function expects.
    function = ctypes.PyDLL(_KERNELS).PyfuncBridge_BeginShutdown
    function.restype = ctypes.c_int
    function.argtypes = []
    _begin_shutdown = function


_conversion = None


def conversion():
    """The Cython conversion module (imported on first use)."""
    global _conversion
    if _conversion is None:
        from pyfunc_bridge import _conversion as module
        from pyfunc_bridge import _frameworks
        _frameworks.register_all(module)  # framework arrays judged by their adapters
        _conversion = module
    return _conversion
