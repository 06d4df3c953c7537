"""The user's own function behind one that autograph converted.

tf.function and tf.data convert the function they trace with autograph,
which rewrites its source: every function *defined* inside it (an inline
lambda, a nested def) is rebuilt from the converted source, with its calls
routed through ``ag__.converted_call`` and a closure over TensorFlow's
autograph module.  Such a function runs in this process, but it pickles with
a reference into TensorFlow: a worker process (which has no TensorFlow)
fails on it and imports TensorFlow trying, and a SavedModel that embeds it
(``portable=True``) fails where it is loaded.  ``dumps`` pickles the
function the user wrote instead, for both.

The original is found through autograph's own records: its transpiler caches
each converted function's factory under the original's code object, and the
factory's module is the file the converted code was compiled from.  The
user's function is the code object nested in that original with the same
name and arguments (where several have them, the one in the same place
among them, or on the line autograph's source map gives), rebuilt with the
converted function's globals, defaults and the closure cells of the same
names (free variables the converted one has too: autograph adds its own).
"""
import io
import types

_MARK = "autograph_info__"  # set on what autograph converted (autograph_artifact)
# TensorFlow's numpy_function, py_func and py_function set this on the function
# they are given (tying their registration's lifetime to it): TF's state, not
# the user's, and it holds autograph's wrapper, which pickles with TensorFlow.
_TF_WRAPPER = "ag_dnc_wrapper__"


class NotRecoverable(TypeError):
    """An autograph-converted function whose original cannot be found."""


def converted(func):
    """Whether `func` is a function that autograph rebuilt from converted source."""
    return type(func) is types.FunctionType and _MARK in func.__dict__


def user_function(func):
    """The function the user wrote, behind the autograph-converted `func`.

    Raises NotRecoverable, saying why and what to do, when autograph's
    records no longer hold it."""
    code = func.__code__
    root, factory = _factory_of(code.co_filename)
    if root is None:
        raise _unrecoverable(func, "autograph no longer holds the function it converted")
    original = _original_code(code, root, factory)
    if isinstance(original, str):
        lines = sorted(_original_lines(factory, code))
        where = f" (line {lines[0]} of {root.co_filename})" if lines else ""
        raise _unrecoverable(func, original, where)
    cells = dict(zip(code.co_freevars, func.__closure__ or ()))  # (a superset: see _original_code)
    user = types.FunctionType(original, func.__globals__, func.__name__, func.__defaults__,
                              tuple(cells[name] for name in original.co_freevars))
    user.__kwdefaults__ = func.__kwdefaults__
    user.__dict__.update((k, v) for k, v in func.__dict__.items() if k != _MARK)
    return user


def dumps(obj, protocol=None):
    """cloudpickle.dumps(obj, protocol), with every autograph-converted
    function in it (`obj` itself, or one it holds, as py_function's caller
    holds the user's function) pickled as the user's function, and every
    code object with its file name."""
    buffer = io.BytesIO()
    pickler_class()(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()


_Pickler = None

# The file name cloudpickle (3.1.3 on) gives every code object it pickles.
_ANONYMOUS_FILE = "<dynamic-code>"


def pickler_class():
    """cloudpickle's Pickler, and the two things the bridge's pickles need
    beyond it (the pool's by-value pickler, pool/pickling.py, builds on it):

    - an autograph-converted function is pickled as the user's;
    - a function pickled by value leaves out the attribute TensorFlow's
      builtins set on it (_TF_WRAPPER), so that a function that one of them
      saw first still travels;
    - a code object keeps its file name, so that a traceback raised where
      the function is unpickled (a worker, a loaded SavedModel) names the
      user's file; cloudpickle 3.1.3 replaced it by "<dynamic-code>"."""
    global _Pickler
    if _Pickler is None:
        import copy
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj):
                if converted(obj):
                    # copy.copy returns a function as it is: the unpickler
                    # gets the user's function, pickled as any other.
                    return copy.copy, (user_function(obj),)
                if type(obj) is types.CodeType:
                    reduce = self.dispatch_table.get(types.CodeType)
                    if reduce is not None:
                        constructor, args = reduce(obj)[:2]
                        return constructor, tuple(
                            obj.co_filename if type(a) is str and a == _ANONYMOUS_FILE else a
                            for a in args)
                reduced = super().reducer_override(obj)
                if type(obj) is types.FunctionType and _TF_WRAPPER in obj.__dict__:
                    return _without_tf_wrapper(reduced)
                return reduced
        _Pickler = Pickler
    return _Pickler


def _without_tf_wrapper(reduced):
    """cloudpickle's by-value reduction of a function, its __dict__ (the
    first part of its state) without _TF_WRAPPER; anything else as it is."""
    if type(reduced) is not tuple or len(reduced) < 3:
        return reduced  # by name (NotImplemented): no __dict__ travels
    state = reduced[2]
    if type(state) is tuple and state and type(state[0]) is dict:
        attributes = {k: v for k, v in state[0].items() if k != _TF_WRAPPER}
        reduced = (*reduced[:2], (attributes, *state[1:]), *reduced[3:])
    return reduced


def _original_code(code, root, factory):
    """The code object in `root` (the original of what autograph converted)
    that became `code`, or why none can be told."""
    arguments = _arguments(code)
    candidates = [c for c in _nested(root) if _arguments(c) == arguments]
    # Autograph keeps the functions the user defined, in their order, and
    # adds its own (branches, scopes), which rarely have the same arguments:
    # where the same number have them, the one in the same place is it.
    converted_roots = [value.__code__ for value in vars(factory.module).values()
                       if type(value) is types.FunctionType
                       and value.__code__.co_filename == code.co_filename]
    alike = [c for r in converted_roots for c in _nested(r) if _arguments(c) == arguments]
    if len(alike) == len(candidates) and any(c is code for c in alike):
        original = candidates[next(i for i, c in enumerate(alike) if c is code)]
        if set(original.co_freevars) <= set(code.co_freevars):
            return original
    # Otherwise: the one on the line autograph's source map gives, or one
    # of several that do the same.
    candidates = [c for c in candidates if set(c.co_freevars) <= set(code.co_freevars)]
    if len(candidates) > 1:
        lines = _original_lines(factory, code)
        candidates = [c for c in candidates if c.co_firstlineno in lines] or candidates
    if not candidates:
        return "no function of its name and arguments is defined in the traced function"
    if len(candidates) > 1 and len({_body(c) for c in candidates}) > 1:
        return f"{len(candidates)} functions of its name and arguments are defined there"
    return candidates[0]


def _factory_of(filename):
    """(the original's code object, the factory) of the converted code
    compiled from `filename`, or (None, None)."""
    from tensorflow.python.autograph.impl import api
    transpiler = getattr(api, "_TRANSPILER", None)
    records = getattr(getattr(transpiler, "_cache", None), "_cache", None)
    if records is None:
        return None, None
    with transpiler._cache_lock:
        entries = [(key, list(subkeys.values())) for key, subkeys in list(records.items())]
    for key, factories in entries:
        for factory in factories:
            module = getattr(factory, "module", None)
            if getattr(module, "__file__", None) == filename:
                return getattr(key, "__code__", key), factory
    return None, None


def _nested(code):
    """The code objects defined in `code`, at any depth."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested(const)


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08


def _arguments(code):
    count = (code.co_argcount + code.co_kwonlyargcount
             + bool(code.co_flags & _CO_VARARGS) + bool(code.co_flags & _CO_VARKEYWORDS))
    return (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
            code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS), code.co_varnames[:count])


def _original_lines(factory, code):
    """The lines of the user's source that autograph's source map gives for
    the converted code's lines."""
    source_map = getattr(factory, "source_map", None) or {}
    converted_lines = {line for _, _, line in code.co_lines() if line is not None}
    return {origin.loc.lineno for location, origin in source_map.items()
            if location.filename == code.co_filename and location.lineno in converted_lines}


def _body(code):
    """What two code objects that do the same thing have in common."""
    return (code.co_code, code.co_names,
            tuple(c for c in code.co_consts if not isinstance(c, types.CodeType)))


def _unrecoverable(func, why, where=""):
    return NotRecoverable(
        f"the function {func.__name__}{where} was converted by autograph (tf.function and "
        f"tf.data convert every function defined inside the function they trace) and the "
        f"function as written cannot be found ({why}); define it outside the traced "
        f"function (at module level, or before the map call), so that it reaches "
        f"pyfunc_bridge as written")
