"""Functions that travel, the resolving side: the Entry for a key this
process did not register, from the op's portable description
(pyfunc_bridge/_portable.py says what it is and what may be run).

The conversion layer calls :func:`resolve` on a registry miss
(``_resolve_missing``, src/conversion/bridge.pxi).  Each key is resolved once
per process (under a lock per key, so that many tf.data threads missing it at
once resolve it exactly once); the result is kept for the life of the process
and entered in the bridge's registry, so later calls cost what a registered
call costs.

This module sits above the APIs: a py_function op named by reference is
rebuilt around the named function as pyfunc_bridge/_py_function.py builds it.
"""
import pickle
import sys
import weakref

import tensorflow as tf

from pyfunc_bridge import _frameworks, _library, _locks, _portable, _py_function, _registry

_resolved = {}      # key -> Entry, for the life of the process
_key_locks = {}     # key -> the lock its resolution runs under
_key_locks_lock = _locks.lock()
resolutions = 0     # how many keys were resolved (tests read it)


def _key_lock(key):
    with _key_locks_lock:
        lock = _key_locks.get(key)
        if lock is None:
            lock = _key_locks[key] = _locks.lock()
        return lock


def resolve(key, reference_, pickled_, framework, tensors, num_outputs):
    """The Entry for a `key` this process did not register, from the op's
    portable description (called by the conversion layer on a miss).

    `tensors`: a py_function op (the reference names the user's function,
    which is wrapped as the op layer wraps it); `num_outputs`: its outputs.
    """
    entry = _resolved.get(key)
    if entry is not None:
        return entry
    with _key_lock(key):
        entry = _resolved.get(key)
        if entry is not None:  # another thread resolved it meanwhile
            return entry
        func = _function(key, reference_, pickled_, tensors, num_outputs)
        conversion = _library.conversion()  # also registers the framework adapters
        adapter = _frameworks.adapter(framework) if framework else None
        entry = _registry.Entry(func, key, adapter)
        _resolved[key] = entry
        # The bridge finds it in its registry from now on; `_resolved` keeps
        # it alive, so the weak reference never dies.
        conversion.registry()[key] = weakref.ref(entry)
        global resolutions
        with _key_locks_lock:
            resolutions += 1
            # Later misses find `_resolved` first; threads already waiting
            # hold the lock itself and see the entry under it.
            _key_locks.pop(key, None)
        return entry


def _function(key, reference_, pickled_, tensors, num_outputs):
    problems = []
    if reference_:
        func = _portable._declared.get(reference_)
        if func is not None:
            return _dense_caller(func, num_outputs) if tensors else func
        module, _, qualname = reference_.partition(":")
        if module not in sys.modules:
            problems.append(
                f"it names the function {reference_!r}, whose module {module!r} is not "
                f"imported in this process; import {module} first (pyfunc_bridge never "
                f"imports modules named in a graph)")
        else:
            problems.append(
                f"it names the function {reference_!r}, which this process did not "
                f"declare portable (only declared functions run by name); if you "
                f"trust it, decorate {qualname} with @pfb.portable in {module}")
    if pickled_:
        if _portable.trusted():
            try:
                return pickle.loads(pickled_)
            except Exception as exc:
                raise ValueError(
                    f"pyfunc_bridge: the function embedded for key {key!r} could not be "
                    f"unpickled ({type(exc).__name__}: {exc}); this process needs the "
                    f"modules it refers to, and the same Python and cloudpickle "
                    f"versions as the process that built it") from exc
        problems.append(
            "it embeds the function as a pickle, which this process does not trust: "
            "unpickling can run arbitrary code. If you trust the graph's author, call "
            "pfb.trust_pickled(True) or set PFB_TRUST_PICKLED=1 in the environment")
    if not problems:
        problems.append(
            "the op carries no portable reference: its function is a lambda, a local "
            "function or defined in __main__, and was built without portable=True. "
            "Define it at module level and declare it with @pfb.portable, or build "
            "the op with portable=True")
    raise ValueError(
        f"pyfunc_bridge: no Python function is registered under key {key!r} (the "
        f"graph was built in another process, or the graph that built it is gone), "
        f"and it cannot be resolved: " + "; and ".join(problems)
        + ". Within one process, keeping the graph or tf.function that built the op "
        "alive also works")


def _dense_caller(func, num_outputs):
    """py_function's caller for dense inputs and outputs: what the op layer
    registers (pyfunc_bridge/_py_function.py), rebuilt from the op."""
    # For dense outputs the caller reads only their count (the conversion
    # layer checks each result against the op's dtypes and shapes).
    signature = _py_function._Signature([tf.TensorSpec(None, tf.float32)] * num_outputs)
    return _py_function._caller(func, (), signature)


_registry.resolver = resolve
