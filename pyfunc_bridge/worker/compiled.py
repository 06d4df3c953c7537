"""The pool's compiled module, as both sides load it."""
import os
import sys


def pool_module():
    """The pool's compiled module (pyfunc_bridge/_pool*.so, built from
    src/pool/ without TensorFlow: the shared-memory layout's rings and arena
    allocator, and the NumPy handler of the result arena), loaded by path:
    importing it through the package would import TensorFlow.  A process that
    loaded it already gets that module."""
    name = "pyfunc_bridge._pool"
    module = sys.modules.get(name)
    if module is not None:
        return module
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # pyfunc_bridge/
    # The import system's own search of that one directory (its extension suffixes).
    spec = importlib.machinery.PathFinder.find_spec(name, [here])
    if spec is None:
        raise ImportError(f"pyfunc_bridge: the pool's compiled module _pool is missing "
                          f"from {here}; build the package (python setup.py build_ext --inplace)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
