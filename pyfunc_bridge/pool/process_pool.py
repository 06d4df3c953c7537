"""The pool's facade: ``ProcessPool``, the default pool and the ``executor=``
of numpy_function, py_func and array_function.  Its parts (this package's
other modules) never import it.

A pool runs functions in worker processes (pyfunc_bridge/worker/, which
never imports TensorFlow), so that Python code that holds the GIL runs on
as many cores as there are workers.  Every call goes over its worker's
shared-memory rings through the pool's native dispatcher; the socket
carries only control and what does not fit an arena or a ring.  Where a
call goes, who owns each block and which file does each step:
docs/pool.md.  Workers die with this process (worker/start_worker.py);
each pool's Supervisor (supervision.py) starts, watches and replaces
them, timeouts.py ends one whose call runs past the pool's timeout, and
fork.py makes the pools' shared memory a forked child's own.
"""
import atexit
import errno
import itertools
import os
import pickle
import sys
import threading
import weakref
from functools import partial
from numbers import Real

from pyfunc_bridge import _locks
from pyfunc_bridge.pool import fork, statistics
from pyfunc_bridge.pool.answers import decode_answer
from pyfunc_bridge.pool.errors import (EXIT_TEXT, PoolClosedError, WorkerError,
                                       dispatch_error, raise_acyclic)
from pyfunc_bridge.pool.pickling import Functions
from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.pool.supervision import Supervisor
from pyfunc_bridge.pool.timeouts import Deadlines, abandoned
from pyfunc_bridge.pool.worker_process import close_fd, shared_memory
from pyfunc_bridge.worker.compiled import pool_module
from pyfunc_bridge.worker.frames import PICKLE_PROTOCOL

DEFAULT_ARENA_BYTES = 64 << 20
_MIN_ARENA_BYTES = 4096      # one page: arena_bytes=0 and smaller pools get this much


class ProcessPool:
    """Worker processes that run ``numpy_function`` / ``py_func`` /
    ``array_function`` calls outside this process, so that Python code that
    holds the GIL runs on several cores (pass it as ``executor=``).

    Args:
      workers: how many processes (default: one per core this process may use).
      arena_bytes: the shared memory for inputs, and again for each worker's
        results (default 64 MiB; at least one page, 4096 bytes, which
        ``0`` asks for): the pool maps at most ``(workers + 1) *
        arena_bytes``.  Inputs wait for room while calls in flight may free
        some; an input that finds none, or is larger than the arena, and a
        result when its worker's arena is full, travels pickled through the
        worker's socket instead (slower, still correct).
      name: the pool's name in errors (default ``ProcessPool-<n>``).
      timeout: the seconds a call may run in a worker (default None: no
        limit), counted from when the worker starts it.  A call past it fails
        with ``tf.errors.DeadlineExceededError``, whose message holds the
        function's Python stack at that moment (file, line and function);
        its worker is ended and replaced, and the calls that worker held but
        had not started run in another.  A stopped worker (SIGSTOP) that
        leaves its calls unstarted for as long is ended the same way, and
        they run in another (one stuck between calls, 60 s later).

    Workers are fresh interpreters (``sys.executable``, never a fork of this
    process) with this process's ``sys.path`` (as it is when a function is
    first sent to a worker) and working directory; they import NumPy and the
    functions they run, not TensorFlow.  A function
    whose module imports TensorFlow (directly or through what its globals
    hold) travels by value, with the globals it uses, so that the worker does
    not import that module; the functions and classes it uses follow the same
    rule, and the modules it uses (``tf`` included) are imported by name.  A
    worker so imports TensorFlow only when the function uses it.  They share no
    Python state with this process or with each other: a function that keeps
    state keeps one copy per worker.  A worker that dies fails the call it
    was running with :class:`WorkerError` and is replaced; the calls it held
    but had not started run in another worker.  ``pfb.stats().pools[name]``
    counts its calls, their time queued and in workers, the bytes in and
    out, the copies saved, workers replaced and timeouts.  Use it as a context
    manager or call :meth:`close`; pools still open are closed at exit.

    >>> import numpy as np, tensorflow as tf
    >>> import pyfunc_bridge as pfb
    >>> with pfb.ProcessPool(1) as pool:
    ...     pfb.numpy_function(np.negative, [tf.constant([1, 2])], tf.int32,
    ...                        executor=pool).numpy()
    array([-1, -2], dtype=int32)
    """

    _numbers = itertools.count(1)

    def __init__(self, workers=None, *, arena_bytes=DEFAULT_ARENA_BYTES, name=None,
                 timeout=None):
        if workers is None:
            workers = len(os.sched_getaffinity(0))  # (Linux, as memfds and eventfds are)
        if type(workers) is not int or workers < 1:
            raise ValueError(f"workers must be a positive int or None (one per core), "
                             f"got {workers!r}")
        if type(arena_bytes) is not int or arena_bytes < 0:
            raise ValueError(f"arena_bytes must be a non-negative int, got {arena_bytes!r}")
        arena_bytes = max(arena_bytes, _MIN_ARENA_BYTES)  # every pool has rings and arenas
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, Real)
                                    or not 0 < timeout < float("inf")):
            raise ValueError(f"timeout must be a positive number of seconds, or None for "
                             f"no limit, got {timeout!r}")
        self.name = name or f"ProcessPool-{next(ProcessPool._numbers)}"
        _memfd_names.add(self.name)  # before its first memfd (fork.py)
        self.workers = workers
        self.arena_bytes = arena_bytes
        self._lock = threading.Lock()  # (the supervisor's too: _closed with its workers)
        self._closed = False    # no new calls: close() has begun
        self._closing = False   # close() began and has not finished (an interrupted close)
        self._close_lock = threading.Lock()  # one close() at a time, to its end
        self._closed_at_exit = False  # closed by _close_pools (_closed_error says so)
        self._pid = os.getpid()      # the process whose pool this is (see _forked)
        self._forked_into = None     # this process's pid, in a fork of that process
        self.timeout = None if timeout is None else float(timeout)
        self._deadlines = None if timeout is None else Deadlines(self, self.timeout)
        self._functions = Functions(self)
        self._counters = statistics.record(self.name)  # pfb.stats().pools[name]
        self._input_fd, self._input_map = shared_memory(arena_bytes, f"{self.name}-inputs")
        try:  # (until the supervisor is, nothing else would close the descriptor)
            # The native side of the workers' rings (src/pool/dispatch.h): it
            # schedules every call and owns the input arena's allocator.  None
            # once closed.
            self._dispatch = pool_module().Dispatcher(self._input_map, workers)
            # (token, CALL flags, owner) -> the dispatcher's Route of those calls
            # (native_route); Python's references, for statistics.
            self._routes = {}
            # payload id -> the pickle of a ring call's input that its worker
            # pulls over the socket (Route.call puts and drops it; _receive
            # answers the worker's ("need", id)); ("load", token) -> a
            # function's LOAD pickle, for as long as it is registered.
            self._payloads = {}
            # Its workers: their start, death, replacement and stop.  From
            # here on close() (or __del__'s) ends what the pool made.
            self._supervisor = Supervisor(self, self._lock)
        except BaseException:  # (a Ctrl-C too)
            close_fd(self, "_input_fd")
            raise
        _live_pools.add(self)
        try:
            for i in range(workers):
                self._supervisor.start(i, first=True)
        except BaseException:
            self.close()
            raise
        if self._deadlines is not None:
            self._deadlines.thread.start()

    def __repr__(self):
        state = "closed" if self._closed else f"{self.workers} workers"
        return f"<pyfunc_bridge.ProcessPool {self.name!r} ({state})>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __copy__(self):
        # A copy would hold the same workers, sockets and memfds: closing one
        # would close the other's descriptors under it.
        raise TypeError(f"{self!r} cannot be copied (copy.copy or copy.deepcopy): a copy "
                        f"would share its worker processes and shared memory, and closing "
                        f"either would break the other; pass the pool itself (threads may "
                        f"share one), or start another ProcessPool")

    def __deepcopy__(self, memo):
        self.__copy__()

    @property
    def closed(self):
        return self._closed

    def _forked(self):
        """In a forked child, at once: this pool is its parent's, closed here
        without a word to its workers (Supervisor.forked).  Its lock may have
        been held by a thread that the fork did not copy: it is made anew."""
        self._lock = threading.Lock()
        self._closed = True
        self._forked_into = os.getpid()
        # The dispatcher's reply threads are not in this process, and its
        # rings are the parent's: deleting it would join threads that do not
        # exist and close the parent's rings.  It is kept, unused, for good.
        if self._dispatch is not None:
            self._dispatch.disown()  # a kernel's route to it now falls back to Python
            _forked_dispatchers.append(self._dispatch)
            self._dispatch = None
        self._routes = {}
        self._supervisor.forked(self._lock)
        close_fd(self, "_input_fd")
        if self._deadlines is not None:
            self._deadlines.stop.set()

    def _closed_error(self, worker=None):
        """The error of every call on this pool once it is closed, whenever it
        closed (`worker`: the one that held the call then)."""
        held = (f" while worker process {worker.pid} held the call (queued there, or "
                f"running)" if worker is not None else "")
        if self._closed_at_exit:
            # (A daemon thread's call that fails so ends silently: _close_pools.)
            why = f"{EXIT_TEXT}{held}"
        elif self._forked_into is None:
            why = (f"{'was' if held else 'is'} closed{held}: a closed pool runs no more "
                   f"calls. Pass an open ProcessPool as executor= (start a new one), or "
                   f"close this one only once its calls are done")
        else:
            why = (f"belongs to process {self._pid}, and this process ({self._forked_into}) "
                   f"is a fork of it: a pool's workers serve only the process that started "
                   f"them. Start a ProcessPool in this process (executor=\"process\" starts "
                   f"a fresh default pool in a forked process)")
        return PoolClosedError(f"pyfunc_bridge: ProcessPool {self.name!r} {why}")

    def pids(self):
        """The process ids of the current workers."""
        return [w.pid for w in self._supervisor.workers if w.alive]

    @property
    def free_input_bytes(self):
        """The bytes of the input arena that no call, and no function that
        kept an input, holds now: ``arena_bytes`` once the pool's calls are
        done and nothing is kept (how to size ``arena_bytes``); 0 when closed.
        Blocks a worker hands back are freed a moment after its call returns."""
        dispatch = self._dispatch
        return dispatch.free_bytes() if dispatch is not None else 0

    # ------------------------------------------------ the converter's side --

    def ring_call(self, func, framework, args, writable, scalars, facts=False, owner=None):
        """Runs `func` on `args` (the values _input_arrays made) in a worker
        over the rings (Route.call; docs/pool.md, "A Python call"): returns
        (the route, which a kernel may keep for its later calls; the DONE's
        Reply, which `decode` turns into values; the pid of the worker that
        ran it).  `writable`: the function may write its inputs
        (PFB_POOL_CALL_WRITABLE); `owner`: see native_route."""
        route = self.native_route(func, framework, writable, scalars, facts, owner)
        if route is None:
            raise self._closed_error()
        pw = pool_module()
        supervisor = self._supervisor
        while True:
            supervisor.revive()  # (a broken pool past its back-off: it starts the lost workers)
            try:
                reply, index = route.call(args, self._payloads,
                                          abandoned=partial(abandoned, self))
                return route, reply, supervisor.workers[index].pid
            except pw.Declined as declined:
                if declined.errno == errno.EAGAIN and not self._closed:
                    # No worker attached: a broken pool refuses only then, since
                    # its live workers serve.  Else an attach, a break and close notify.
                    broken = supervisor.broken
                    if broken:
                        raise WorkerError(broken) from None
                    supervisor.wait_for_worker(0.05)
                    continue
                if declined.errno == errno.EPIPE or self._closed:
                    raise self._closed_error() from None
                raise
            except pw.DispatchFailed as failed:
                code, text = failed.args
                failed = None
                raise_acyclic(dispatch_error(code, text))

    def native_route(self, func, framework, writable, scalars, facts=False, owner=None):
        """The Route of `func`'s calls with these CALL flags (shm_layout.h,
        PFB_POOL_CALL_*; `facts`: copy=False wants the worker's copy facts)
        for `owner` (whatever the caller counts a route's calls under: one
        route each, so that two names of one function count apart), or None
        once the pool is closed.  A function is registered once: its LOAD
        carries this process's sys.path."""
        dispatch = self._dispatch
        if dispatch is None or self._closed:
            return None
        pw = pool_module()
        flags = ((pw.CALL_WRITABLE if writable else 0) | (pw.CALL_SCALARS if scalars else 0)
                 | pw.FRAMEWORK_FLAGS[framework] | (pw.CALL_FACTS if facts else 0))
        token, data = self._functions.get(func)
        with self._lock:
            if self._closed:  # (close() sets it under this lock, then deletes the dispatcher)
                return None
            route = self._routes.get((token, flags, owner))
            if route is None:
                if ("load", token) not in self._payloads:  # not registered yet
                    load = pickle.dumps((list(sys.path), data), protocol=PICKLE_PROTOCOL)
                    dispatch.register(token, load)
                    self._payloads[("load", token)] = load  # a LOAD the arena has no room for
                route = self._routes[(token, flags, owner)] = dispatch.route(token, flags)
                self._counters.add_route(route)
        return route

    def _forget_native(self, token):
        """`token`'s function was dropped: its routes go, and the
        dispatcher forgets it (its workers get a FORGET)."""
        dispatch = self._dispatch
        with self._lock:
            for key in [k for k in self._routes if k[0] == token]:
                self._counters.drop_route(self._routes.pop(key))
            self._payloads.pop(("load", token), None)
        if dispatch is not None:
            dispatch.forget(token)

    def decode(self, reply, copied, result_view):
        """decode_answer of a DONE: ring_call's Reply, or the address of a
        kernel's native call's DONE that the kernel hands to the conversion
        layer.  `result_view`: the conversion layer's view of a result block
        (worker_result), passed down so that the pool never calls up."""
        return decode_answer(self.name, reply, copied, self._counters, result_view)

    # --------------------------------------------------------------- close --

    def __del__(self):
        if ((not getattr(self, "_closed", True) or getattr(self, "_closing", False))
                and hasattr(self, "_supervisor")):
            # Dropped without close() (or mid-close): its workers end with it.
            # No later close() can finish one that a Ctrl-C interrupts here.
            while True:
                try:
                    self.close()
                    return
                except KeyboardInterrupt:
                    pass

    def close(self):
        """Ends the workers and frees the shared memory; calls in flight fail
        with PoolClosedError.  Idempotent; a close() that was interrupted
        (Ctrl-C while it waits for a worker) is finished by the next one, or
        at interpreter exit."""
        if self._forked_into is not None:
            return  # the parent's pool, closed in this fork by _forked
        with self._close_lock:  # a concurrent close() returns once this one has ended
            with self._lock:
                if self._closed and not self._closing:
                    return
                self._closed = self._closing = True
                self._closed_at_exit = self._closed_at_exit or _exiting
                workers = list(self._supervisor.workers)
            # Each step is safe to run again after an interruption.
            self._supervisor.close(workers)  # (their native calls fail as on a closed pool)
            # Its reply threads have ended; it held the input mapping.
            self._dispatch = None
            if self._deadlines is not None:
                self._deadlines.close()
            close_fd(self, "_input_fd")
            # The input mapping goes with the last reference to it (a Route.call
            # still copying holds the dispatcher); result mappings, see
            # WorkerProcess.ended.
            self._input_map = None
            _live_pools.discard(self)
            self._closing = False


# ------------------------------------------------------------- executors --

_live_pools = weakref.WeakSet()
_forked_dispatchers = []  # of pools inherited by a fork (ProcessPool._forked): never freed
_memfd_names = set()  # the names of every pool's memfds (fork.py)
_default = None
_default_lock = _locks.lock()


def _before_fork():
    # The spawner's wait first: the result arenas' copy must be the last
    # thing before the fork (workers write on meanwhile), and its lock lets
    # one fork at a time own the copy.
    spawner.before_fork()
    fork.before_fork(_memfd_names)


def _after_fork_in_parent():
    fork.drop_copies()
    spawner.after_fork_in_parent()


def _after_fork_in_child():
    """A forked child has none of the parent's pools (their workers serve
    the parent): they are closed here without touching them, and
    executor="process" starts a fresh default pool on first use."""
    global _default
    spawner.after_fork_in_child()
    for pool in list(_live_pools):
        pool._forked()
    _live_pools.clear()  # this process's atexit hook must not close them
    # Their shared memory (and that of pools closed since, which results
    # may still view) becomes the child's own.
    fork.forget_shared_memory(_memfd_names)
    _default = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class _DefaultPool:
    """executor="process": the process's shared pool, started on first use.
    Each call resolves it once (ring_call), so a default pool replaced
    meanwhile by another thread (closed, then started anew) never sees a
    call that began in the old one."""

    def ring_call(self, func, framework, args, writable, scalars, facts=False, owner=None):
        return default_pool().ring_call(func, framework, args, writable, scalars, facts, owner)

    def decode(self, reply, copied, result_view):
        # Named and counted as the default pool, whichever one ran the call
        # (pools of one name share one record).
        return decode_answer(_DEFAULT_POOL_NAME, reply, copied,
                             statistics.record(_DEFAULT_POOL_NAME), result_view)

    def __repr__(self):
        return "'process' (the shared default ProcessPool)"


DEFAULT = _DefaultPool()
_DEFAULT_POOL_NAME = "the default ProcessPool"


def default_pool():
    """The shared pool of executor="process" (one worker per core), started
    on first use and closed at exit."""
    global _default
    pool = _default
    if pool is None or pool.closed:
        if _exiting:  # after _close_pools: a pool started now would outlive it
            raise PoolClosedError(f"pyfunc_bridge: the default ProcessPool {EXIT_TEXT}")
        with _default_lock:
            if _default is None or _default.closed:
                _default = ProcessPool(name=_DEFAULT_POOL_NAME)
            pool = _default
    return pool


def executor(value, api):
    """The pool an `executor=` argument names: None (in-process), DEFAULT, or a
    ProcessPool; raises for anything else."""
    if value is None or value is DEFAULT:
        return value
    if isinstance(value, ProcessPool):
        return value  # (a closed one fails each call as one that closes meanwhile: ring_call)
    if isinstance(value, str) and value == "process":
        return DEFAULT
    raise ValueError(
        f"{api}: executor must be None (in this process), \"process\" (the shared "
        f"default pool) or a pfb.ProcessPool, got {value!r}")


_exiting = False


@atexit.register
def _close_pools():
    """Registered on first import, after pyfunc_bridge's own hook, so it runs
    first: calls waiting on a pool fail and return before TF's workers are
    shut out of the bridge.  A daemon thread whose call fails so ends
    silently, as Python ends daemon threads at exit."""
    global _exiting
    _exiting = True
    if _live_pools:
        previous = threading.excepthook

        def excepthook(args):
            if (args.thread is not None and args.thread.daemon
                    and EXIT_TEXT in str(args.exc_value)):
                return
            previous(args)
        threading.excepthook = excepthook
    for pool in list(_live_pools):
        pool.close()
