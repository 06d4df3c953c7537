"""Functions that travel, the declaring side: what a process declares
portable, whether it trusts pickles, and the portable description an op
carries (used while building ops, pyfunc_bridge/_op.py).

Every graph-mode op names its function twice (src/kernel/ops.cc): by its
per-process key (pyfunc_bridge/_registry.py) and by a portable description in
the attributes ``reference`` (``module:qualname``, when the function is
importable by name), ``pickled`` (the function serialized by cloudpickle, with
``portable=True``) and ``framework`` (array_function's framework).  A graph
that runs where its key is not registered (a SavedModel in a fresh process, a
tf.data service worker, a graph whose source graph was dropped) is resolved
from that description by pyfunc_bridge/_resolve.py, in this order:

1. by reference, only to a function that this process declared portable
   (:func:`portable`, or the decorator forms of the APIs).  Nothing is ever
   imported: a graph cannot make this process import or run what it did not
   choose;
2. from the pickle, only where this process trusts pickles
   (:func:`trust_pickled` or ``PFB_TRUST_PICKLED=1``), since unpickling can
   run arbitrary code.

Resolving rebuilds py_function's caller, which needs the API above this
module: hence the two modules, so that imports run one way.
"""
import os
import sys

# Pickles live in graph attributes, which every copy of the graph carries
# (GraphDefs, SavedModels, each tf.data service job): a larger one almost
# always means captured data, which belongs in an op input instead.
MAX_PICKLED_BYTES = 64 * 1024

_declared = {}      # "module:qualname" -> the declared function
_trust = None       # None: as PFB_TRUST_PICKLED says


def _names(func):
    """(module, qualname) of `func`, or None when it has no usable names."""
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return module, qualname


def _nameable(names):
    """Whether another process can name the function by `module:qualname`:
    not a lambda or a local function, not in ``__main__`` (whose meaning
    differs from one program to the next)."""
    return names is not None and names[0] != "__main__" and "<" not in names[1]


def portable(func):
    """Declares a module-level function portable: graphs built elsewhere may
    run it by name.

    A graph carries ``module:qualname`` of each function it calls.  Where the
    graph's own process is gone (a SavedModel loaded in a fresh process, a
    tf.data service worker), pyfunc_bridge runs the function of that name
    only if this process declared it, by importing its module.  The decorator
    forms ``@pfb.numpy_function(...)`` and ``@pfb.py_function(...)`` declare
    their functions too.  Returns `func` unchanged.

    >>> import json
    >>> import pyfunc_bridge as pfb
    >>> dumps = pfb.portable(json.dumps)           # any importable function
    >>> dumps is json.dumps
    True

    Lambdas, local functions and functions of ``__main__`` have no name that
    another process could import; build their ops with ``portable=True``
    instead, which embeds the function itself (see :func:`trust_pickled`).
    """
    names = _names(func)
    if not callable(func) or names is None:
        raise TypeError(
            f"pfb.portable declares module-level functions, got "
            f"{type(func).__name__}: {func!r}")
    if not _nameable(names):
        where = ("is defined in __main__, which another program cannot import"
                 if names[0] == "__main__" else
                 "is a lambda or a local function, which has no importable name")
        raise ValueError(
            f"pfb.portable: {names[0]}:{names[1]} {where}; move it to the top level "
            f"of a module, or build its op with portable=True to embed the function "
            f"itself")
    _declared[f"{names[0]}:{names[1]}"] = func
    return func


def declare_if_nameable(func):
    """What the decorator forms of the APIs do: declare `func` when it has an
    importable name, and say nothing otherwise."""
    names = _names(func)
    if _nameable(names):
        _declared[f"{names[0]}:{names[1]}"] = func


def trust_pickled(flag=True):
    """Lets this process run functions embedded as pickles in graphs.

    Ops built with ``portable=True`` carry their function serialized by
    cloudpickle.  Unpickling can run arbitrary code, so a process loads such
    a function only when it trusts the graph's author: after
    ``pfb.trust_pickled(True)``, or with ``PFB_TRUST_PICKLED=1`` in the
    environment (for processes whose code you do not write, such as tf.data
    service workers).  An explicit call overrides the environment.  Returns
    the previous setting.

    >>> import pyfunc_bridge as pfb
    >>> previous = pfb.trust_pickled(True)
    >>> pfb.trust_pickled(previous)
    True
    """
    global _trust
    if not isinstance(flag, bool):
        raise TypeError(f"trust_pickled takes True or False, got {flag!r}")
    previous = trusted()
    _trust = flag
    return previous


def trusted():
    """Whether this process runs pickled functions."""
    if _trust is not None:
        return _trust
    return os.environ.get("PFB_TRUST_PICKLED") == "1"


# ------------------------------------------------------------- op building --

def _reachable(module, qualname, func):
    """Whether `module.qualname` is `func`, or a wrapper of it (a decorator
    form of the APIs)."""
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    while obj is not None:
        if obj is func:
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False


def reference(func):
    """``module:qualname`` of `func` when another process can import it by
    that name, else ""."""
    names = _names(func)
    if not _nameable(names) or not _reachable(names[0], names[1], func):
        return ""
    return f"{names[0]}:{names[1]}"


def _captured(func):
    """(name, value) of what pickling `func` by value takes along: closure
    cells, defaults and the globals its code names."""
    code = getattr(func, "__code__", None)
    if code is None:
        return []
    items = []
    for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
        try:
            items.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    for i, value in enumerate(getattr(func, "__defaults__", None) or ()):
        items.append((f"default #{i}", value))
    globals_ = getattr(func, "__globals__", {})
    items.extend((name, globals_[name]) for name in code.co_names if name in globals_)
    return items


def _largest_captures(func, dumps):
    sizes = []
    for name, value in _captured(func):
        if type(value).__name__ == "module":
            continue
        try:
            size = len(dumps(value))
        except Exception:  # noqa: BLE001 - only sizes are wanted here
            continue
        sizes.append((size, name, type(value).__name__))
    sizes.sort(reverse=True)
    return [f"{name!r} (a {kind}, {size:,} bytes pickled)" for size, name, kind in sizes[:3]]


def pickled(obj, func):
    """`obj` (what the kernel will run: `func` or a caller around it)
    serialized by cloudpickle, the user's own function for one autograph
    converted; raises when it cannot be or is too large."""
    import cloudpickle  # only ops built with portable=True need it
    from pyfunc_bridge import _autograph
    names = _names(func)
    what = f"{names[0]}:{names[1]}" if names else repr(func)
    try:
        data = _autograph.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"portable=True: the function {what} cannot be pickled ({type(exc).__name__}: "
            f"{exc}); it probably captures an object that cannot cross processes (a "
            f"lock, a file, a session). Create that object inside the function, or "
            f"define the function at module level and declare it with @pfb.portable"
        ) from exc
    if len(data) > MAX_PICKLED_BYTES:
        largest = _largest_captures(func, cloudpickle.dumps)
        captured = ("; it captures " + ", ".join(largest)) if largest else ""
        raise ValueError(
            f"portable=True: the function {what} pickles to {len(data):,} bytes, over "
            f"the {MAX_PICKLED_BYTES:,}-byte limit for a function embedded in a graph"
            f"{captured}. Pass large data as an op input (inp=[...]) or load it inside "
            f"the function, or define the function at module level and declare it "
            f"with @pfb.portable (then only its name travels)")
    return data


def attrs(func, portable_flag, framework, obj=None, nameable=True):
    """The op's portable attributes for `func`.

    `obj`: what the kernel runs when it is not `func` itself (py_function's
    caller), pickled with ``portable=True``.  `nameable`: False where a
    reference alone could not rebuild the op's function (py_function with
    composite inputs or outputs).
    """
    if type(portable_flag) is not bool:
        raise TypeError(f"portable must be True or False, got {portable_flag!r}")
    return {
        "reference": reference(func) if nameable else "",
        "pickled": pickled(func if obj is None else obj, func) if portable_flag else b"",
        "framework": framework or "",
    }
