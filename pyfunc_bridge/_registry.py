"""The function registry: stable unique keys, lifetimes tied to graphs.

A key is ``module:qualname@<uuid>``: unique for the life of the process (never
a reused counter) and carrying an importable reference to the function.  Each
graph that contains a bridge op holds the function's entry (and the Defun
definition a graph is traced for); the registry itself holds only a weak
reference, so an entry goes when its last holder goes.
"""
import functools
import sys
import uuid
import weakref

from tensorflow.python.framework import function as _function
from tensorflow.python.framework import ops as _tf_ops

from pyfunc_bridge import _library

_GRAPH_ATTR = "_pyfunc_bridge_entries"


class Entry:
    """A registered function; graphs that run it keep it alive.

    ``framework`` is None for NumPy functions, else the framework adapter of an
    array_function (pyfunc_bridge/_frameworks.py); ``converter`` is the
    conversion layer's converter for it, which the bridge's driver calls.
    ``record`` (py_function): whether a call may need its gradient (eager
    calls decide per call; in graphs the kernel sees whether one is wired).
    `name` is the op's ``name=``, under which the statistics count its calls
    (None: the function's ``__qualname__``); `stats_record` is where the
    conversion layer counts them.  `eager`: the entry of an eager call, whose
    0-d inputs a NumPy function receives as 0-d arrays (in graphs: as NumPy
    scalars, as TensorFlow hands them over); it picks the converter.
    `executor`: None (in this process), or the pool the calls run in
    (pyfunc_bridge/pool/), whose converter the entry gets.  `api`: the
    public function that built the op ("numpy_function", "py_func",
    "array_function"), for the profiler's events; None: the conversion layer
    tells it from the call (an op loaded from elsewhere, py_function).
    """

    __slots__ = ("func", "key", "framework", "converter", "record", "name",
                 "stats_record", "api", "__weakref__")

    def __init__(self, func, key, framework=None, record=True, name=None, eager=False,
                 executor=None, api=None):
        self.func = func
        self.key = key
        self.framework = framework
        if executor is None:
            self.converter = _library.conversion().converter(framework, eager)
        else:
            self.converter = _library.conversion().process_converter(framework, eager,
                                                                     executor)
        self.record = record
        self.name = name
        self.stats_record = None
        self.api = api

    def __repr__(self):
        return f"<pyfunc_bridge entry {self.key}>"


def function_reference(func):
    """``module:qualname`` of a callable, as far as it has one."""
    module = getattr(func, "__module__", None) or type(func).__module__
    qualname = (getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
                or type(func).__qualname__)
    return f"{module}:{qualname}"


def _forget(functions, key, ref):
    if functions.get(key) is ref:
        del functions[key]


def register(func, framework=None, name=None, eager=False, executor=None, api=None):
    """Registers `func` under a new key and returns its Entry."""
    functions = _library.conversion().registry()
    key = f"{function_reference(func)}@{uuid.uuid4().hex}"
    entry = Entry(func, key, framework, name=name, eager=eager, executor=executor, api=api)
    # A partial, not a lambda: it holds _forget itself, which the module's
    # globals no longer do when entries still held at exit are collected.
    functions[key] = weakref.ref(entry, functools.partial(_forget, functions, key))
    return entry


def lookup(key):
    """The Entry registered under `key`, or None."""
    ref = _library.conversion().registry().get(key)
    return ref() if ref is not None else None


# pyfunc_bridge._resolve.resolve, set as that module is imported (it sits
# above the op layer, which may need it: a loaded graph's function).
resolver = None


def owning_graphs(graph):
    """The graphs that must keep an op's function alive.

    That is `graph` and every graph it is nested in (while-loop bodies, cond
    branches, tf.function bodies, the graphs of the older ``Defun`` functions
    that tf.data's legacy map builds), except the global graph behind eager
    execution, which lives forever.  Holding it in all of them keeps it alive
    as long as any of them can still run the op.
    """
    graphs = []
    while graph is not None:
        graphs.append(graph)
        graph = getattr(graph, "outer_graph", None)
    if _tf_ops.executing_eagerly_outside_functions():
        graphs = [g for g in graphs if g.building_function]
    return graphs


def _defun_owner(graph):
    """The ``_DefinedFunction`` (framework/function.py) whose graph `graph` is
    while it is being traced, or None.

    Such a graph is dropped once its function definition is made, and the
    definition object lives on (in a dataset's map function, a Defun's
    callers; TensorFlow removes the definition from the eager context when it
    goes), so it is that object which must hold the functions.  Found on the
    stack: the tracing frame names the graph it builds, its caller the
    definition."""
    if not isinstance(graph, _function._FuncGraph):
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code is _function.func_graph_from_py_func.__code__
                and frame.f_locals.get("func_graph") is graph):
            caller = frame.f_back
            if caller is not None and caller.f_code is _CREATE_DEFINITION:
                return caller.f_locals.get("self")
            return None
        frame = frame.f_back
    return None


_CREATE_DEFINITION = _function._DefinedFunction._create_definition_if_needed_impl.__code__


def keep_alive(entry, graph):
    """Makes `graph`, its outer graphs and the Defun definitions they are being
    traced for hold `entry`."""
    graphs = owning_graphs(graph)
    owners = graphs + [d for d in map(_defun_owner, graphs) if d is not None]
    for owner in owners:
        held = getattr(owner, _GRAPH_ATTR, None)
        if held is None:
            held = []
            setattr(owner, _GRAPH_ATTR, held)
        held.append(entry)
