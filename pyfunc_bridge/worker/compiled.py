"""The worker's compiled module, as both sides load it."""
import os
import sys


def pool_module():
    """The worker's compiled module (pyfunc_bridge/_pool_worker*.so, built from
    src/pool/ without TensorFlow: the shared-memory layout's rings and arena
    allocator, and the NumPy handler of the result arena), loaded by path:
    importing it through the package would import TensorFlow.  A process that
    loaded it already gets that module."""
    name = "pyfunc_bridge._pool_worker"
    module = sys.modules.get(name)
    if module is not None:
        return module
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # pyfunc_bridge/
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_pool_worker" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            return module
    raise ImportError(f"pyfunc_bridge: the worker's compiled module _pool_worker is missing "
                      f"from {here}; build the package (python setup.py build_ext --inplace)")
