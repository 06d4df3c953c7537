"""The functions gil_bound's workers run.

A function shipped to a ProcessPool by reference is imported from its module
in each worker, and so is torch DataLoader's dataset in each of its spawned
workers: this module imports NumPy only, so that neither kind of worker
loads TensorFlow (seconds of start-up and hundreds of MiB each).
"""
import numpy as np


def python_work(x, loops):
    """About 1 ms of pure-Python arithmetic (`loops` calibrated to it); holds
    the GIL throughout, like a tokenizer or a parser written in Python."""
    total = int(x)
    for i in range(int(loops)):
        total = (total * 31 + i) % 1000003
    return np.int64(total)


def identity(a):
    return a


def times_two(a):
    return a * 2


class Work:
    """python_work as a map-style torch Dataset: element i is python_work(i)."""

    def __init__(self, n, loops):
        self.n, self.loops = n, loops

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return python_work(i, self.loops)
