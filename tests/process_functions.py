"""Functions that tests/test_process_pool.py runs in worker processes.

A module of its own, importing only the standard library and NumPy: a worker
imports a function's module to run it (functions travel by reference), and
the test modules import TensorFlow, which a worker should not have to load.
"""
import os
import sys
import time

import numpy as np

calls = 0  # what stateful() counts, in whichever process runs it


def plus_one(a):
    return a + 1


def double(a):
    return a * 2


def identity(a):
    return a


def add(a, b):
    return a + b


def returns_a_lambda(a):
    return lambda: a  # pickle cannot send it back


def returns_an_array_and_a_lambda(a):
    return [a * 2, lambda: a]


def _cannot_load():
    raise RuntimeError("this value does not load in the parent")


class LoadsOnlyWhereMade:
    """Pickles in the worker; unpickling it raises."""

    def __reduce__(self):
        return (_cannot_load, ())


def returns_what_does_not_load(a):
    return LoadsOnlyWhereMade()


def pid(_):
    return np.int64(os.getpid())


def slow_pid(seconds):
    """Waits, then returns the worker's pid: holds a worker for a while."""
    time.sleep(float(seconds))
    return np.int64(os.getpid())


def stateful(_):
    global calls
    calls += 1
    return np.int64(calls)


def raises_value_error(_):
    raise ValueError("bad value from the worker")


def raises_key_error(_):
    raise KeyError("missing key in the worker")


class Unpicklable(Exception):
    """An exception that cannot be rebuilt from its pickle."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def raises_unpicklable(_):
    raise Unpicklable("one", "two")


def exits(code):
    os._exit(int(code))


def upper(s):
    return np.char.upper(s.astype(bytes)).astype(object)


def to_float(_):
    return 2.5


def float64_array(a):
    return np.asarray(a, dtype=np.float64)


def two_results(a):
    return a + 1, a * 2


def view_of_input(a):
    return a[::2]


def torch_square(t):
    return t * t


def _concatenate(items):
    if type(items[0]).__module__.startswith("torch"):
        import torch
        return torch.cat(items)
    return np.concatenate(items)


def _equal(a, b):
    if type(a).__module__.startswith("torch"):
        import torch
        return torch.equal(a, b)
    return np.array_equal(a, b)


def keeper():
    """A function that keeps every input it is given (an accumulator) and
    returns them all, concatenated: it reads the inputs of earlier calls."""
    kept = []

    def keep(x):
        kept.append(x)
        return _concatenate(kept)
    return keep


def deduplicator():
    """A function that flags inputs it has seen before (keeping each one)."""
    seen = []

    def is_duplicate(x):
        duplicate = any(_equal(x, s) for s in seen)
        seen.append(x)
        return np.bool_(duplicate)
    return is_duplicate


def keep_last():
    """Keeps only its latest input: each call lets go of the one before."""
    last = []

    def keep(x):
        last[:] = [x]
        return x.sum()
    return keep


def slow_double_in_place(a):
    """Holds the worker a while, then doubles its input in place (NumPy
    under copy=True, or torch) and returns it."""
    time.sleep(0.15)
    a *= 2
    return a


def briefly_double_in_place(*arrays):
    """slow_double_in_place of each of its inputs, for a few milliseconds;
    returns their sum."""
    time.sleep(0.003)
    for a in arrays:
        a *= 2
    return sum(arrays)


def loaded(names):
    """Which of the modules `names` (bytes) this process has imported: asked
    of a worker, it tells what a function sent to it brought in."""
    return np.array([bytes(name).decode() in sys.modules for name in names])
