"""Locks that a forked child makes anew.

A thread that held a lock at a fork is not in the child, so the child's copy
of that lock would stay held for good, and its first use there would wait for
ever.  Every lock of this package that a forked child may take is made here;
the child reinitializes each in place (as CPython's threading and logging do
with theirs), so that modules keep their references to it.
"""
import os
import threading
import weakref

_made = weakref.WeakSet()


def lock(kind=threading.Lock):
    """A new lock (`kind`: threading.Lock or threading.Condition) that a
    forked child finds free."""
    made = kind()
    _made.add(made)
    return made


def _after_fork_in_child():
    for made in list(_made):
        made._at_fork_reinit()


os.register_at_fork(after_in_child=_after_fork_in_child)
