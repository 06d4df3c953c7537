"""Module-level functions for tests/pipelines/test_travel_*.py, imported by name
in the processes those tests start (they put this folder on their PYTHONPATH).

Importing this module declares the first group portable, as any user module
would; the second group is importable but never declared.
"""
import os
import pathlib
import threading
import time

import numpy as np

import pyfunc_bridge as pfb


# ---------------------------------------------------------------- declared --

@pfb.portable
def times2(a):
    return a * 2


@pfb.portable
def cube(x):
    """py_function: a TF computation, so that its gradient is 3 x**2."""
    return x * x * x


@pfb.portable
def affine(i):
    return 3 * i + 1


@pfb.portable
def worker_pid(a):
    """Which process ran the element (the tf.data service test)."""
    return np.full_like(a, os.getpid())


@pfb.portable
def torch_softplus(t):
    """array_function(framework="torch"): fails unless it receives torch tensors."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    return torch.nn.functional.softplus(t)


# ---------------------------------------------- importable, never declared --

def undeclared_writer(a):
    """Leaves the file $PFB_TEST_MARKER behind when it runs: proof that it did."""
    pathlib.Path(os.environ["PFB_TEST_MARKER"]).touch()
    return a


# --------------------------------------------- concurrent resolution probe --

made = 0
_made_lock = threading.Lock()


def slow_make():
    """Unpickled for every resolution: counts them, and is slow enough that
    threads which miss the same key at once overlap."""
    global made
    time.sleep(0.3)
    with _made_lock:
        made += 1
    return times2


class SlowlyUnpickled:
    """Pickles to a call of slow_make (by reference)."""

    def __reduce__(self):
        return slow_make, ()
