"""Checks that pool tests share with the scripts they run in fresh
interpreters (which import this module, never conftest): where a result
lives, when a pool's input arena is whole again, whether a worker still
runs, which of a pool's memfds and sockets this process holds, and a
stream of Ctrl-C."""
import os
import random
import signal
import sys
import threading
import time

import pyfunc_bridge as pfb


def memfd_mappings(name):
    """(start, end) of this process's mappings of the memfds whose names
    start with `name` (a pool's shared memory is memfds named after it,
    which /proc/self/maps shows and /dev/shm does not)."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            if f"/memfd:{name}" in line:
                start, end = line.split()[0].split("-")
                found.append((int(start, 16), int(end, 16)))
    return found


def in_arena(pool, tensor):
    """Whether `tensor`'s memory is a block of one of `pool`'s workers'
    result arenas (memfds named "<pool name>-results")."""
    data = pfb.to_numpy(tensor).ctypes.data
    return any(start <= data < end for start, end in memfd_mappings(f"{pool.name}-results"))


def settled(pool):
    """Waits until `pool`'s input arena is whole again (its calls done: a
    worker's blocks are freed a moment after its call returns); a script's
    timeout bounds the wait."""
    while pool.free_input_bytes != pool.arena_bytes:
        time.sleep(0.01)
    return pool.arena_bytes


class Interrupts:
    """SIGINT to the main thread every 0 to `most` seconds, from `after`
    seconds on, until stop(); a script's main thread calls in between.

    A signal raises KeyboardInterrupt only inside during(), once per call:
    one landing in the script's own bookkeeping (its loop test, its except
    clause) would end the script, not test the pool."""

    def __init__(self, seed, most=0.006, after=0.5):
        self._main = threading.main_thread().ident
        self._random = random.Random(seed)
        self._armed = False
        signal.signal(signal.SIGINT, self._on_sigint)
        self._stop = threading.Event()
        self._sender = threading.Thread(target=self._send, args=(most, after))
        self._sender.start()

    def _on_sigint(self, signum, frame):
        if self._armed:
            self._armed = False
            raise KeyboardInterrupt

    def _send(self, most, after):
        self._stop.wait(after)
        while not self._stop.wait(self._random.uniform(0, most)):
            signal.pthread_kill(self._main, signal.SIGINT)

    def during(self, function, *args, **kwargs):
        """function(*args, **kwargs), which a SIGINT interrupts at any moment."""
        self._armed = True
        try:
            return function(*args, **kwargs)
        finally:
            self._armed = False

    def stop(self):
        """Ends the stream and puts back Python's own SIGINT handler."""
        self._stop.set()
        self._sender.join()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def broken_pool(workers, name, failing_start):
    """A ProcessPool whose workers all ended as they started (their script
    was `failing_start`, one that exits): broken, its back-off under way.
    Starts after this one run the real worker again."""
    import tensorflow as tf
    import process_functions as pf
    from pyfunc_bridge.worker import start_worker
    real = start_worker.__file__
    start_worker.pool_module()  # loaded by its real path, before the workers fail
    start_worker.__file__ = failing_start
    try:
        pool = pfb.ProcessPool(workers, name=name)
        try:
            pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
            raise AssertionError("a worker served")
        except tf.errors.UnknownError as error:
            assert "cannot start worker processes" in error.message, error.message
        return pool
    finally:
        start_worker.__file__ = real


def worker_alive(pid):
    """Whether `pid` is still one of our worker processes (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"_worker.py" in f.read()
    except OSError:
        return False


def memfds_of(name):
    """This process's open descriptors and mappings of the memfds whose names
    start with `name` (a pool's shared memory never shows in /dev/shm)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        if target.startswith(f"/memfd:{name}"):
            fds.append(target)
    with open("/proc/self/maps") as f:
        maps = [line for line in f if f"/memfd:{name}" in line]
    return fds, maps


def descriptors(*kinds):
    """This process's descriptors whose targets start with one of `kinds`
    ("socket:", "/memfd:", "anon_inode:[eventfd]": a worker's socket,
    segments and doorbell), as (number, target)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        if target.startswith(kinds):
            found.append((int(fd), target))
    return found


def call_pid(pool, box):
    """Calls process_functions.pid in `pool`: the worker's pid goes into
    box["pid"], or what the call raised into box["error"] (a thread's target)."""
    import tensorflow as tf

    import process_functions as pf
    try:
        box["pid"] = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                            executor=pool))
    except Exception as exc:  # noqa: BLE001 - reported
        box["error"] = f"{type(exc).__name__}: {exc}"


def served_or_exit(pool, name, seconds, also=None):
    """Calls process_functions.pid in pool `name` on a daemon thread for up
    to `seconds` (a fault script's last call): (the pid that ran it, the
    pool's workers_replaced).  A call still waiting, failed, or run by a
    worker the pool no longer lists is written to stderr, with `also` as it
    is then, and the process exits at once with 1 (close() would wait for a
    worker the dispatcher holds)."""
    box = {}
    caller = threading.Thread(target=call_pid, args=(pool, box), daemon=True)
    caller.start()
    caller.join(seconds)
    counted = pfb.stats().pools.get(name)  # absent while nothing is counted
    replaced = counted.workers_replaced if counted else 0
    if caller.is_alive() or "error" in box or box["pid"] not in pool.pids():
        print(f"the call: {box or 'still waits'}; workers {pool.pids()}; replaced {replaced}"
              + ("" if also is None else f"; {also!r}"), file=sys.stderr, flush=True)
        os._exit(1)
    return box["pid"], replaced


def child_exit_code(pid, hung, seconds=60):
    """The exit code of forked child `pid` once it ends; past `seconds` it is
    killed and AssertionError(`hung`) raised."""
    deadline = time.monotonic() + seconds
    while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(hung)
        time.sleep(0.01)
    return os.waitstatus_to_exitcode(status[1])
