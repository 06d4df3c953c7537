"""How a function is pickled for a worker process (pyfunc_bridge/pool/), and
the token each function has in a pool's workers.

A function sent by name makes the worker import its module.  A pipeline's
map functions usually live in a module that imports TensorFlow, and a worker
that imports it pays seconds of start-up and hundreds of MiB for a function
that may need NumPy only.  The rule, applied to the function and to every
function and class it reaches through its globals, defaults and closure:

* an object whose module imports TensorFlow, directly or through its
  globals (``imports_tensorflow``), travels **by value**: its code, with the
  globals it uses.  TensorFlow's own objects are the exception (sent by value
  they would still need TensorFlow);
* any other importable object travels by name (cloudpickle's default);
  lambdas, closures and ``__main__``'s functions travel by value as always;
* a module travels by name: a function that uses ``tf`` imports TensorFlow in
  the worker, as it must;
* if the by-value pickle fails (a global that does not pickle, such as a
  lock), the function is pickled as before, by name, and the worker imports
  its module.

cloudpickle chooses by value per module (``register_pickle_by_value``, a
process-wide registry): the modules the pickle meets are registered for the
length of one ``dumps``, under a lock, and unregistered after.
"""
import functools
import importlib
import io
import itertools
import sys
import threading
import types
import weakref

from pyfunc_bridge import _autograph, _locks
from pyfunc_bridge.worker.frames import PICKLE_PROTOCOL

_lock = _locks.lock()  # one dumps at a time touches cloudpickle's registry


def _is_tensorflow(name):
    return name.partition(".")[0] == "tensorflow"


def _with_parents(name):
    """`name` and its parent packages (importing a.b.c runs a and a.b)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _sources(module):
    """The names of the modules `module`'s globals come from: a module's own
    name, a function's or class's ``__module__``, an instance's class's."""
    try:
        values = list(vars(module).values())
    except TypeError:  # no __dict__
        return
    for value in values:
        kind = type(value)
        try:
            if issubclass(kind, types.ModuleType):
                name = value.__name__
            elif kind in (types.FunctionType, types.BuiltinFunctionType) or \
                    issubclass(kind, type):
                name = value.__module__
            else:
                name = kind.__module__
        except Exception:  # noqa: BLE001 - a lazy or odd object: it tells nothing
            continue
        if isinstance(name, str):
            yield name


def imports_tensorflow(module):
    """Whether importing `module` in a fresh process would import TensorFlow,
    as far as the modules loaded in this process tell: TensorFlow is among
    the modules its globals (modules, functions, classes, instances) come
    from, theirs, and so on, parent packages included.  The standard library
    is not searched (it never imports TensorFlow)."""
    stdlib = sys.stdlib_module_names
    seen = set()
    pending = _with_parents(module.__name__)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if _is_tensorflow(name):
            return True
        if name.partition(".")[0] in stdlib:
            continue
        found = sys.modules.get(name)
        if isinstance(found, types.ModuleType):
            for source in _sources(found):
                if source not in seen:
                    pending.extend(_with_parents(source))
    return False


def dumps(func, protocol):
    """The pickle of `func` for a worker, by the rule above."""
    import cloudpickle
    buffer = io.BytesIO()
    try:
        with _lock:
            pickler = _by_value_pickler(cloudpickle)(buffer, protocol=protocol)
            try:
                pickler.dump(func)
            finally:
                for module in pickler.registered:
                    cloudpickle.unregister_pickle_by_value(module)
        return buffer.getvalue()
    except Exception:  # noqa: BLE001 - the by-name pickle below says what fails
        return _autograph.dumps(func, protocol=protocol)


@functools.cache
def _by_value_pickler(cloudpickle):
    """A cloudpickle Pickler class that registers, for one dumps, the modules
    of the functions and classes it meets that import TensorFlow."""
    class Pickler(_autograph.pickler_class()):
        def __init__(self, file, protocol):
            super().__init__(file, protocol=protocol)
            self.registered = []   # modules this pickler registered
            self._decided = {}     # module name -> by value?

        def reducer_override(self, obj):
            if _autograph.converted(obj):
                pass  # the user's function: the base class sends it instead
            elif isinstance(obj, types.ModuleType):
                # A module by name, even one registered above (cloudpickle
                # would send its whole namespace, TensorFlow and all).
                name = obj.__name__
                if any(self._decided.get(n) for n in _with_parents(name)):
                    return importlib.import_module, (name,)
            elif isinstance(obj, (types.FunctionType, type)):
                name = getattr(obj, "__module__", None)
                if isinstance(name, str) and name not in self._decided:
                    self._decide(name)
            return super().reducer_override(obj)

        def _decide(self, name):
            module = sys.modules.get(name)
            by_value = (isinstance(module, types.ModuleType) and not _is_tensorflow(name)
                        and not _registered(cloudpickle, name)
                        and imports_tensorflow(module))
            self._decided[name] = by_value
            if by_value:
                cloudpickle.register_pickle_by_value(module)
                self.registered.append(module)

    return Pickler


def _registered(cloudpickle, name):
    """Whether `name` (or a parent) is registered by value already (by the
    user: then it stays so, and stays theirs to unregister)."""
    registry = cloudpickle.list_registry_pickle_by_value()
    return any(n in registry for n in _with_parents(name))


class Functions:
    """func -> (token, pickle) for the life of func; a function dropped in
    this process is dropped from the workers too."""

    def __init__(self, pool):
        self._pool = weakref.ref(pool)
        self._by_id = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, func):
        found = self._by_id.get(id(func))
        if found is None or found[0]() is not func:
            with self._lock:  # (looked up again: another thread may have added it)
                found = self._by_id.get(id(func))
                if found is None or found[0]() is not func:
                    token = next(self._tokens)
                    data = pickle_function(func)
                    key = id(func)
                    try:
                        ref = weakref.ref(func, functools.partial(self._drop, key, token))
                    except TypeError:  # not weakly referable: kept (ids must not be reused)
                        ref = (lambda func=func: func)
                    found = self._by_id[key] = (ref, token, data)
        return found[1], found[2]

    def _drop(self, key, token, ref, finalizing=sys.is_finalizing):
        if finalizing():  # a function collected at exit: module globals are going
            return
        self._by_id.pop(key, None)
        pool = self._pool()
        if pool is not None:
            pool._forget_native(token)


def pickle_function(func):
    try:  # by value or by name (this module's rule), as written (not as autograph converted it)
        return dumps(func, PICKLE_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"executor: the function {func!r} cannot be sent to a worker process "
            f"({type(exc).__name__}: {exc}); it probably captures an object that cannot "
            f"cross processes (a lock, a file, a session). Create that object inside "
            f"the function, or run it in-process (executor=None)") from exc
