"""Loading of the compiled layers: the op library and the conversion module.

The op library loads at import (about 5 ms), so that graphs naming the ops
can be loaded and run: SavedModels, imported GraphDefs, tf.data service
workers; its Python op wrappers are made when the first op is built.  The
conversion module (and any framework) loads on first use, so that
``import pyfunc_bridge`` costs little beyond ``import tensorflow``.
"""
import atexit
import importlib
import importlib.machinery
import logging
import os
import re
import threading

from pyfunc_bridge import _locks

_INSTALL_HINT = ("pip install 'pyfunc_bridge[cpu]' (tensorflow-cpu) or "
                 "'pyfunc_bridge[gpu]' (tensorflow, GPU-capable)")

try:
    import tensorflow as tf
except ModuleNotFoundError as exc:
    if exc.name != "tensorflow":
        raise
    # No TensorFlow is a requirement of the package (the user chooses the
    # distribution): say which to install.
    raise ImportError(
        f"pyfunc_bridge needs TensorFlow 2.21.x, and none is installed: "
        f"{_INSTALL_HINT}") from None

_HERE = os.path.dirname(os.path.abspath(__file__))
# Named per Python (it calls CPython's C API), as extension modules are.
_KERNELS = os.path.join(_HERE, "_kernels" + importlib.machinery.EXTENSION_SUFFIXES[0])
_lock = _locks.lock()
_registered = False
_ops = None  # the generated op wrappers, once made
_begin_shutdown = None  # the kernel's PyfuncBridge_BeginShutdown, once loaded
# The TF exports the kernel's direct EagerTensor path lacks ("" for none), once loaded.
_eager_api_missing = None
# The text of the CancelledError of a bridge call refused at exit (bridge.cc).
_SHUTDOWN_ERROR = "pyfunc_bridge: the Python interpreter is not running"


@atexit.register
def _on_exit():
    """Stops TF's worker threads from entering Python before it finalizes.

    Registered at import, so it runs after the atexit hooks registered later
    (hooks run last-in, first-out): those may still use the bridge.
    """
    begin_shutdown()


_shutdown_begun = False


def begin_shutdown():
    """Refuses bridge calls on every thread but this one from now on (they
    fail with CancelledError), and waits, up to 10 s and without the GIL,
    for the calls under way.  What interpreter exit does; earlier, for a
    program that must stop TF's threads while it holds the GIL (a tf.data
    service worker's stop() holds it while it waits for the pipeline's
    threads, which may be waiting for it in a bridge call)."""
    global _shutdown_begun
    if _begin_shutdown is None:
        return
    if not _shutdown_begun:
        _shutdown_begun = True
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


def installed_distributions():
    """'name version' of each installed distribution that provides the
    ``tensorflow`` package (tensorflow, tensorflow-cpu, ...), for messages."""
    from importlib import metadata  # only on the error path: it scans site-packages
    found = []
    for name in dict.fromkeys(metadata.packages_distributions().get("tensorflow", [])):
        try:
            # The canonical project name (the wheel's metadata may say tensorflow_cpu).
            project = re.sub(r"[-_.]+", "-", metadata.metadata(name)["Name"]).lower()
            found.append(f"{project} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return " and ".join(found) or "a TensorFlow of unknown distribution"


def check_tensorflow_version(installed=None):
    """Raises ImportError unless the installed TensorFlow (`installed`: its
    version, default ``tf.__version__``) is the minor version we were built for."""
    try:
        from pyfunc_bridge._build_config import TF_VERSION
    except ImportError:
        raise ImportError(
            "pyfunc_bridge is not built: install it with `pip install .[cpu]` (or "
            "`pip install -e .[cpu]` in a checkout)") from None
    installed = tf.__version__ if installed is None else installed
    if _major_minor(installed) != _major_minor(TF_VERSION):
        needed = ".".join(_major_minor(TF_VERSION))
        raise ImportError(
            f"pyfunc_bridge needs TensorFlow {needed}.x (it was built for "
            f"TensorFlow {TF_VERSION}), but {installed_distributions()} is installed "
            f"(tensorflow {installed}). Install TensorFlow {needed}.x: "
            f"{_INSTALL_HINT}; or rebuild pyfunc_bridge against the installed "
            f"TensorFlow, from a checkout: pip install --no-build-isolation -e .")


def register():
    """Loads the op library once, which registers its ops and kernels with
    TensorFlow (about 5 ms): enough for graphs that name the ops."""
    global _registered
    if not _registered:
        with _lock:
            if not _registered:
                if not os.path.exists(_KERNELS):
                    raise ImportError(
                        f"pyfunc_bridge's op library is missing ({_KERNELS}); "
                        f"reinstall pyfunc_bridge")
                # Not the conversion layer: that loads when the first op is
                # built (or, in a graph from elsewhere, first run).
                tf.load_library(_KERNELS)
                _set_shutdown_hook()
                _check_eager_api()
                _registered = True


def ops():
    """The op library's generated Python wrappers, made on first use: making
    them takes 20-35 ms, four times the load itself."""
    global _ops
    if _ops is None:
        register()
        with _lock:
            if _ops is None:
                # TF hands back the library register() loaded (it keeps one per file).
                _ops = tf.load_op_library(_KERNELS)
    return _ops


def _kernel_function(name, restype):
    """A function the kernel library exports, called through ctypes: the
    library TF just loaded (dlopen hands back the same handle); PyDLL keeps
    the GIL held across the call, as the kernel's functions expect."""
    import ctypes
    function = getattr(ctypes.PyDLL(_KERNELS), name)
    function.restype = restype
    function.argtypes = []
    return function


def _set_shutdown_hook():
    import ctypes
    global _begin_shutdown
    _begin_shutdown = _kernel_function("PyfuncBridge_BeginShutdown", ctypes.c_int)


def _check_eager_api():
    """Reads which TF exports the kernel's direct EagerTensor path lacks, and
    says once per process when it lacks any."""
    import ctypes
    global _eager_api_missing
    _eager_api_missing = _kernel_function("PyfuncBridge_EagerApiMissing",
                                          ctypes.c_char_p)().decode()
    if _eager_api_missing:
        logging.getLogger("pyfunc_bridge").warning(
            "pyfunc_bridge: TensorFlow %s does not export %s; py_function makes its "
            "EagerTensors through DLPack instead (slower per call, still without "
            "copies)", tf.__version__, _eager_api_missing)


def eager_api_missing():
    """The names of the TF exports that the kernel's direct EagerTensor path
    (py_function's inputs and results without DLPack) did not find, as a
    tuple; empty when the path is taken."""
    register()
    return tuple(_eager_api_missing.split(", ")) if _eager_api_missing else ()


_conversion = None


def _gpu_stream(device_id):
    """The handle of the CUDA stream TF computes on at GPU `device_id` (it is
    the same for the process's life)."""
    with tf.init_scope(), tf.device(f"/GPU:{device_id}"):
        return int(ops().pyfunc_bridge_gpu_stream())


def conversion():
    """The Cython conversion module (imported on first use; it registers the
    framework adapters of pyfunc_bridge/_frameworks.py itself)."""
    global _conversion
    if _conversion is None:
        import ctypes
        # By module name: `from pyfunc_bridge import _conversion` would ask the
        # package's __getattr__, which comes back here.
        module = importlib.import_module("pyfunc_bridge._conversion")
        register()
        # TF's profiler, which the kernel library links (bridge_abi.h,
        # PfbTraceApi): every call records its events through it.
        module.set_trace_api(_kernel_function("PyfuncBridge_TraceApi", ctypes.c_void_p)())
        module.set_gpu_stream_source(_gpu_stream)
        _conversion = module
    return _conversion
