"""Process workers: ``ProcessPool`` and the ``executor=`` of numpy_function,
py_func and array_function.

A pool runs functions in worker processes (pyfunc_bridge/_worker.py, a
script that imports NumPy and the user's function, never TensorFlow), so
that Python code that holds the GIL runs on as many cores as there are
workers.

Traffic: every call goes over the shared-memory rings of its worker
(src/pool/shm_layout.h), through the pool's native dispatcher
(src/pool/dispatch.h), which schedules it, copies its inputs into the input
arena and waits for its DONE without the GIL.  Kernels post their calls
themselves (src/kernel/pool_route.cc); Python posts eager calls, a kernel's
first call and profiled calls with ``ring_call`` (src/pool/route.pxi), and
decodes their DONE with ``_answer``.  Each worker's socket carries only
control (the hello, "ready", its end as the worker's death) and what does
not fit an arena, pickled: an input the worker pulls by payload id, a
function's LOAD, a result its arena has no room for, and the argument list
of a CALL larger than its ring (docs/pool.md).  A function travels once per
worker (pickled by _pickling's rule: by value when its module imports
TensorFlow, else as cloudpickle does), then its token does.

Lifetime: workers die with this process (PR_SET_PDEATHSIG, set in the
worker; _pool_spawn starts them all from one thread); a pool with a timeout
ends a worker whose call runs past it (_Deadlines); the calls a dead worker
had not started go to another (the dispatcher resends them); a fork of this
process finds the pools closed and their shared memory its own
(_after_fork_in_child).
"""
import atexit
import builtins
import errno
import itertools
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from numbers import Real

import numpy as np

from pyfunc_bridge import _pickling, _pool_fork, _pool_stats, _worker
from pyfunc_bridge._pool_spawn import spawner as _spawner
from pyfunc_bridge._errors import CallTimeoutError

DEFAULT_ARENA_BYTES = 64 << 20
_CLOSE_GRACE_SECONDS = 1.0   # then a worker still running a function is killed
_START_FAILURES = 3          # workers in a row that die before they are ready
_RETRY_SECONDS = 1.0         # then calls fail this long, before the pool tries again
_RETRY_MAX_SECONDS = 60.0    # (the wait doubles while it keeps failing, up to this)
_STACK_GRACE_SECONDS = 1.0   # for a timed-out worker to write its stack, then SIGKILL
_RING_SLOTS = 256            # per ring of a worker's control segment (16 KiB each)
_MIN_ARENA_BYTES = 4096      # one page: arena_bytes=0 and smaller pools get this much


class WorkerError(RuntimeError):
    """A worker process ended while it held the call (killed, crashed,
    ``os._exit``).  The pool replaces it; later calls run."""


class PoolClosedError(RuntimeError):
    """The call's pool was closed (by ``close()``, or at interpreter exit)."""


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker, attached as its
    ``__cause__`` so that the TF error's message shows where it was raised."""

    def __str__(self):
        return "the traceback in the worker process:\n\n" + self.args[0].rstrip()


def _shared_memory(size, name):
    """(fd, mmap) of `size` bytes of anonymous shared memory (None, None for 0)."""
    if not size:
        return None, None
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


# Dispatchers of pools inherited by a fork (ProcessPool._forked): never freed.
_forked_dispatchers = []

class _Worker:
    """The parent's side of one worker process."""

    def __init__(self, pool, index):
        self.index = index
        # Held while a thread writes the socket (a payload), and by ended():
        # the descriptor is not closed under a write.
        self.write_lock = threading.Lock()
        self.alive = True
        self.ready = False
        # With a timeout: the call this worker was told off for, and where it
        # writes its stack when told to (_Deadlines).
        self.timed_out = None  # that call's running_call (shm_layout.h)
        self.kill_at = None    # when it gets SIGKILL if its stack has not ended it
        self.trace_fd = None
        self.proc = None
        # The worker's control segment (src/pool/shm_layout.h: its request
        # and reply rings; None without arenas) and its doorbell, an eventfd
        # that this process owns and writes after posting requests when the
        # worker sleeps (it polls it with its socket).  Kept until ended().
        self.channel = self.doorbell = None
        self.generation = None  # its attachment to the pool's dispatcher (_attach)
        result_fd = control_fd = parent = child = None
        try:
            result_fd, self.result_map = _shared_memory(pool.arena_bytes,
                                                        f"{pool.name}-results")
            hello = {"path": list(sys.path), "result_bytes": pool.arena_bytes, "name": pool.name,
                     "input_bytes": pool.arena_bytes if pool._input_fd else 0}
            extra_fds = []
            if pool._deadlines is not None:
                self.trace_fd = pool._deadlines.prepare(hello)
                extra_fds = [self.trace_fd]
            # Every worker has one, arenas or not: the call it runs shows
            # there (_Deadlines reads it); its rings serve only with arenas.
            pw = _worker.pool_module()
            control_fd, control = _shared_memory(pw.control_bytes(_RING_SLOTS),
                                                 f"{pool.name}-control")
            self.doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.channel = pw.Channel(control, create=True, ring_slots=_RING_SLOTS,
                                      input_bytes=pool.arena_bytes,
                                      result_bytes=pool.arena_bytes,
                                      worker_index=index, doorbell=self.doorbell)
            hello["ring"] = {"control_fd": control_fd, "doorbell_fd": self.doorbell,
                             "ring_slots": _RING_SLOTS}
            extra_fds += [control_fd, self.doorbell]
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            fds = [child.fileno(), pool._input_fd or -1, result_fd or -1]
            # This process's pid: the worker checks it after asking to die with
            # its parent (a parent that died before that has another pid).
            self.proc = _spawner.popen(
                [sys.executable, _worker.__file__, str(os.getpid()), *map(str, fds)],
                pass_fds=[fd for fd in fds + extra_fds if fd >= 0], cwd=os.getcwd(),
                stdin=subprocess.DEVNULL)
            child.close()  # the worker's now
            child = None
            self.sock = parent
            self.sock_fd = parent.fileno()
            self.pid = self.proc.pid
            parent.sendall(_worker.frame(hello, pickle.dumps))
            # (The pool weakly: a pool dropped without close() is collected.)
            self.reader = threading.Thread(target=ProcessPool._read,
                                           args=(weakref.ref(pool), self), daemon=True,
                                           name=f"{pool.name} reader {index}")
            self.reader.start()
        except BaseException:
            # No reader will see this worker end (the hello failed, or its
            # start): it is ended here, and what it held closed.
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
            for sock in (parent, child):
                if sock is not None:
                    sock.close()
            if self.trace_fd is not None:
                os.close(self.trace_fd)
            self._close_channel()
            raise
        finally:
            for fd in (result_fd, control_fd):
                if fd is not None:
                    os.close(fd)  # mapped here, and passed to the worker

    def ended(self):
        """Lets go of what the parent holds of this worker once it has ended:
        its socket (under the write lock: no write is under way on the
        descriptor), and its result mapping, which stays mapped only while an
        output views one of its blocks (each _ResultBlock keeps it)."""
        with self.write_lock:
            self.sock.close()
        self.result_map = None
        self._close_channel()

    def _close_channel(self):
        if self.channel is not None:
            self.channel.close()  # any wait on either ring returns
            self.channel = None
        if self.doorbell is not None:
            os.close(self.doorbell)
            self.doorbell = None


class _Functions:
    """func -> (token, pickle) for the life of func; a function dropped in
    this process is dropped from the workers too."""

    def __init__(self, pool):
        self._pool = weakref.ref(pool)
        self._by_id = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, func):
        found = self._by_id.get(id(func))
        if found is not None and found[0]() is func:
            return found[1], found[2]
        with self._lock:
            found = self._by_id.get(id(func))
            if found is not None and found[0]() is func:
                return found[1], found[2]
            token = next(self._tokens)
            data = _pickle_function(func)
            key = id(func)
            try:
                ref = weakref.ref(func, lambda _, key=key, token=token: self._drop(key, token))
            except TypeError:  # not weakly referable: kept (ids must not be reused)
                ref = (lambda func=func: func)
            self._by_id[key] = (ref, token, data)
            return token, data

    def _drop(self, key, token):
        self._by_id.pop(key, None)
        pool = self._pool()
        if pool is not None:
            pool._forget_native(token)


def _pickle_function(func):
    try:  # by value or by name (_pickling's rule), as written (not as autograph converted it)
        return _pickling.dumps(func, _worker._PICKLE_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"executor: the function {func!r} cannot be sent to a worker process "
            f"({type(exc).__name__}: {exc}); it probably captures an object that cannot "
            f"cross processes (a lock, a file, a session). Create that object inside "
            f"the function, or run it in-process (executor=None)") from exc


class _Deadlines:
    """A pool's per-call timeout.

    Each worker writes the call it starts and when (CLOCK_MONOTONIC, the
    same clock in every process) in its control segment's running call
    (shm_layout.h).  A watchdog thread sleeps until
    the earliest deadline of a running call (at most `timeout`: a call that
    starts meanwhile ends later).  A worker whose call is past its deadline
    gets SIGUSR1, on which ``faulthandler`` writes its Python stack to the
    worker's trace file and then lets the signal end it (``chain=True`` over
    the default action); one that does not end within _STACK_GRACE_SECONDS
    gets SIGKILL.  The worker's reader then finds the end of its stream
    (_lost): the call it was told off for fails with CallTimeoutError and the
    stack, and the dispatcher sends the calls it held but had not started
    to another worker, since they never ran."""

    def __init__(self, pool, timeout):
        self.timeout_ns = int(timeout * 1e9)
        self.timeout = timeout
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, args=(weakref.ref(pool),),
                                       daemon=True, name=f"{pool.name} watchdog")

    @staticmethod
    def prepare(hello):
        """Before a worker starts: the hello names its trace file (a memfd
        this process reads), which is returned."""
        trace_fd = os.memfd_create(f"{hello['name']}-stack", os.MFD_CLOEXEC)
        hello["deadlines"] = {"trace_fd": trace_fd}
        return trace_fd

    def _watch(self, pool_ref):
        while not self.stop.is_set():
            pool = pool_ref()
            if pool is None:
                return
            wait = self._check(pool)
            del pool
            self.stop.wait(wait)

    def _check(self, pool):
        """Signals the workers whose call is past its deadline; returns the
        seconds until the next deadline could pass (None: the pool closed)."""
        now = time.monotonic_ns()
        wait = self.timeout_ns
        with pool._lock:
            if pool._closed:
                return None  # close() reaps the workers, then stops this thread
            # Under the lock, a worker marked alive has not been reaped, so
            # its pid is still its own, and its control segment mapped.
            for worker in pool._workers:
                if not worker.alive or worker.channel is None:
                    continue
                running, start = worker.channel.running()
                if worker.kill_at is not None and running != worker.timed_out:
                    # The call it was told off for answered after all (its
                    # function handled SIGUSR1): the worker lives on, and its
                    # later calls have deadlines of their own.
                    worker.kill_at = worker.timed_out = None
                if worker.kill_at is not None:  # told to write its stack
                    if now >= worker.kill_at:
                        os.kill(worker.pid, signal.SIGKILL)
                        worker.kill_at = float("inf")
                    else:
                        wait = min(wait, worker.kill_at - now)
                    continue
                if not running:
                    continue  # between calls
                if now - start >= self.timeout_ns:
                    worker.timed_out = running
                    worker.kill_at = now + int(_STACK_GRACE_SECONDS * 1e9)
                    os.kill(worker.pid, signal.SIGUSR1)
                    wait = min(wait, worker.kill_at - now)
                else:
                    wait = min(wait, start + self.timeout_ns - now)
        return max(wait, 0) / 1e9

    def error(self, pool, worker, running, death):
        """The exception of the call whose running call (shm_layout.h, its
        id) is `running`, which `worker` had started when it ended (0: none
        of its calls was told off)."""
        if worker.timed_out is None or worker.timed_out != running:
            if worker.timed_out is None:
                return WorkerError(death)
            return WorkerError(
                f"pyfunc_bridge: worker process {worker.pid} of {pool.name} was ended "
                f"because another call ran past the {self.timeout:g} s timeout; this call "
                f"had just started in it. The pool starts a new worker, so later calls run.")
        stack = self.stack(worker)
        pool._counters.count_timeout()
        return CallTimeoutError(
            f"pyfunc_bridge: the call ran past the {self.timeout:g} s timeout of {pool.name} "
            f"in worker process {worker.pid}, which was ended; the pool starts a new "
            f"worker, so later calls run. The function's Python stack then:\n\n{stack}")

    @staticmethod
    def stack(worker):
        """What faulthandler wrote in `worker`'s trace file, without the
        frames of the worker's own loop."""
        try:
            size = os.fstat(worker.trace_fd).st_size
            text = os.pread(worker.trace_fd, size, 0).decode("utf-8", "replace")
        except (OSError, TypeError):
            text = ""
        lines = [line for line in text.splitlines()
                 if not (line.lstrip().startswith("File ") and _worker.__file__ in line)]
        if not any(line.lstrip().startswith("File ") for line in lines):
            return (f"(none: the worker wrote no stack within {_STACK_GRACE_SECONDS:g} s of "
                    f"SIGUSR1 and was killed; a function that handles SIGUSR1 hides it)")
        return "\n".join(lines).strip()

    @staticmethod
    def forget(worker):
        """Closes the trace file of a worker that ended."""
        if worker.trace_fd is not None:
            os.close(worker.trace_fd)
            worker.trace_fd = None

    def close(self):
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)


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
        had not started run in another.

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
    state keeps one copy per worker.  A worker that dies fails the calls it
    held with :class:`WorkerError` and is replaced.  ``pfb.stats().pools[name]``
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
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
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
        _memfd_names.add(self.name)  # before its first memfd (_pool_fork)
        self.workers = workers
        self.arena_bytes = arena_bytes
        self._lock = threading.Lock()
        self._closed = False    # no new calls: close() has begun
        self._closing = False   # close() began and has not finished (an interrupted close)
        self._close_lock = threading.Lock()  # one close() at a time, to its end
        self._closed_at_exit = False  # closed by _close_pools (_why_closed says so)
        self._pid = os.getpid()      # the process whose pool this is (see _forked)
        self._forked_into = None     # this process's pid, in a fork of that process
        self._broken = None        # why no worker can start, once that is clear
        self._start_failures = 0   # workers in a row that ended before they were ready
        self._retry_at = 0.0       # when a broken pool may try again (time.monotonic)
        self._retry_delay = None   # the last back-off (None: none since a worker was ready)
        self.timeout = None if timeout is None else float(timeout)
        self._deadlines = None if timeout is None else _Deadlines(self, self.timeout)
        self._functions = _Functions(self)
        self._counters = _pool_stats.record(self.name)  # pfb.stats().pools[name]
        self._input_fd, self._input_map = _shared_memory(arena_bytes, f"{self.name}-inputs")
        # The native side of the workers' rings (src/pool/dispatch.h): it
        # schedules every call and owns the input arena's allocator.  None
        # once closed.
        self._dispatch = _worker.pool_module().Dispatcher(self._input_map, workers)
        self._generations = itertools.count(1)  # a worker slot's attachments
        # (token, CALL flags) -> the dispatcher's Route of those calls
        # (native_route); Python's references, for statistics.
        self._routes = {}
        # payload id -> the pickle of a ring call's input that its worker
        # pulls over the socket (Route.call puts and drops it; _receive
        # answers the worker's ("need", id)); ("load", token) -> a
        # function's LOAD pickle, for as long as it is registered.
        self._payloads = {}
        self._attached = threading.Condition()  # a worker joined the dispatcher (ring_call)
        self._workers = []
        _live_pools.add(self)
        try:
            for i in range(workers):
                self._workers.append(_Worker(self, i))
                self._attach(self._workers[-1])
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

    def _why_closed(self):
        if self._closed_at_exit:
            # (A daemon thread's call that fails so ends silently: _close_pools.)
            return _EXIT_TEXT
        if self._forked_into is None:
            return "is closed"
        return (f"belongs to process {self._pid}, and this process ({self._forked_into}) "
                f"is a fork of it: a pool's workers serve only the process that started "
                f"them. Start a ProcessPool in this process (executor=\"process\" starts "
                f"a fresh default pool in a forked process)")

    def _forked(self):
        """In a forked child, at once: this pool is its parent's.  Its workers
        and their sockets are the parent's (a write here would garble the
        parent's stream, a shutdown or a kill would end its workers): it is
        closed here without a word to them, and this process's copies of its
        descriptors are closed.  Its locks may have been held by a thread
        that the fork did not copy: they are made anew."""
        self._lock = threading.Lock()
        self._attached = threading.Condition()
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
        for worker in self._workers:
            worker.alive = False
            worker.sock.detach()  # the socket object must not close the fd ...
        for worker in self._workers:
            # The rings are the parent's too: dropped here, never closed
            # (closing writes to the shared control segment).
            worker.channel = None
            for fd in (worker.sock_fd, worker.trace_fd, worker.doorbell):
                if fd is not None:
                    try:
                        os.close(fd)  # ... this process's copy, closed here
                    except OSError:
                        pass
        if self._input_fd is not None:
            os.close(self._input_fd)
            self._input_fd = None
        if self._deadlines is not None:
            self._deadlines.stop.set()

    def pids(self):
        """The process ids of the current workers."""
        return [w.pid for w in self._workers if w.alive]

    @property
    def free_input_bytes(self):
        """The bytes of the input arena that no call, and no function that
        kept an input, holds now: ``arena_bytes`` once the pool's calls are
        done and nothing is kept (how to size ``arena_bytes``); 0 when closed.
        Blocks a worker hands back are freed a moment after its call returns."""
        dispatch = self._dispatch
        return dispatch.free_bytes() if dispatch is not None else 0

    # ------------------------------------------------ the converter's side --

    def ring_call(self, func, framework, args, writable, scalars, facts=False):
        """Runs `func` on `args` (the values _input_arrays made) in a worker
        over the rings, as a kernel's native call runs (Route.call): returns
        (the route, which a kernel may keep for its later calls; (result,
        bytes the worker wrote to shared memory, copy facts per result)).
        Inputs the input arena has no room for, those the records cannot
        describe, and the argument list of a CALL larger than the ring, are
        pulled by the worker over its socket (Route.call's `payloads`).
        Waits for a worker while none is attached (the pool is starting or
        replacing them), with the GIL released; Ctrl-C abandons the call
        (its blocks stay its worker's until it is done with them)."""
        route = self.native_route(func, framework, writable, scalars, facts)
        if route is None:
            raise PoolClosedError(f"pyfunc_bridge: {self.name} {self._why_closed()}")
        pw = _worker.pool_module()
        from pyfunc_bridge import _library
        conversion = _library.conversion()
        traced = conversion.trace_now()  # 0 unless a profiler records (trace.pxi)
        while True:
            if self._broken:
                self._revive()
                if self._broken:
                    raise WorkerError(self._broken)
            try:
                reply, index, _ = route.call(args, self._payloads)
                break
            except pw.Declined as declined:
                if declined.errno == errno.EAGAIN and not self._closed:
                    self._wait_for_worker()
                    continue
                if declined.errno == errno.EPIPE or self._closed:
                    raise PoolClosedError(
                        f"pyfunc_bridge: {self.name} {self._why_closed()}") from None
                raise
            except pw.DispatchFailed as failed:
                code, text = failed.args
                failed = None
                _raise_acyclic(_dispatch_error(code, text))
        if traced:
            conversion.trace_worker(traced, reply.message.stamp, reply.message.ended,
                                    self._workers[index].pid)
        return route, _answer(self.name, reply, writable, self._counters)

    def _wait_for_worker(self):
        """Sleeps until a worker may have been attached (or the pool broke or
        closed): _attach, _lost and close notify."""
        with self._attached:
            self._attached.wait(0.05)

    def native_route(self, func, framework, writable, scalars, facts=False):
        """The Route of `func`'s calls with these CALL flags (dispatch.h;
        shm_layout.h: torch, JAX and CuPy travel as PFB_POOL_CALL_* flags;
        `facts`, copy=False, asks the worker for its copy facts), which
        ring_call posts on and a kernel keeps for its later calls; None
        once the pool is closed.  A pool's timeout watches every call
        (_Deadlines).  Registered with the dispatcher once per function: the
        LOAD carries this process's sys.path."""
        dispatch = self._dispatch
        if dispatch is None or self._closed:
            return None
        pw = _worker.pool_module()
        flags = ((pw.CALL_WRITABLE if writable else 0) | (pw.CALL_SCALARS if scalars else 0)
                 | pw.FRAMEWORK_FLAGS[framework] | (pw.CALL_FACTS if facts else 0))
        token, data = self._functions.get(func)
        with self._lock:
            route = self._routes.get((token, flags))
            if route is None:
                if not dispatch.knows(token):
                    load = pickle.dumps((list(sys.path), data), protocol=_worker._PICKLE_PROTOCOL)
                    dispatch.register(token, load)
                    self._payloads[("load", token)] = load  # a LOAD the arena has no room for
                pw.set_counting(_pool_stats.counting())
                route = self._routes[(token, flags)] = dispatch.route(token, flags)
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

    def native_reply(self, address, writable):
        return native_reply(self.name, address, writable, self._counters)

    # ------------------------------------------------------ reader threads --

    @staticmethod
    def _read(pool_ref, worker):
        """The reader thread of one worker's socket: it answers the worker's
        pulls and notes its answers too large for its arena; at the end of
        the stream, the worker is dead (_lost).  It holds the pool only
        while it handles a read: a pool dropped without close() is
        collected, and __del__ closes it (its stream then ends)."""
        frames = _worker.FrameReader(worker.sock)
        unreadable = None
        try:
            # No local keeps a message while the next is awaited (a large
            # pickled result would stay alive until then).
            while True:
                received = frames.read(pickle.loads)
                pool = pool_ref()
                if pool is None or not pool._receive(worker, received):
                    break
                del pool, received
        except (OSError, EOFError):
            pass
        except Exception as exc:  # noqa: BLE001 - a message this process cannot load
            # The stream is lost: end the worker, so that every call it held
            # fails rather than waits for ever.
            worker.proc.kill()
            unreadable = (f"sent a message this process cannot unpickle "
                          f"({type(exc).__name__}: {exc}), so it was ended")
        pool = pool_ref()
        if pool is not None:
            pool._lost(worker, unreadable)

    def _receive(self, worker, received):
        """Handles the messages of one read; False at the end of the stream."""
        for message in received:
            kind = message[0]
            if kind == "ring":  # ("ring", call_id, ok, payload, facts): _answer's
                _ring_answers.put(message[1], message[2:])
            elif kind == "need":  # ("need", payload id): a call's input
                self._send_payload(worker, message[1])
            elif kind == "ready":  # ("ready", pid)
                worker.ready = True
                self._start_failures = 0
                self._retry_delay = None
            else:
                raise ValueError(f"an unknown message {kind!r}")
        return bool(received)

    def _send_payload(self, worker, payload_id):
        """Answers a worker's ("need", id) (shm_layout.h,
        PFB_POOL_TENSOR_SOCKET): ("payload", id, the pickled input), or None
        once its caller has stopped waiting."""
        message = pickle.dumps(("payload", payload_id, self._payloads.get(payload_id)),
                               protocol=_worker._PICKLE_PROTOCOL)
        with worker.write_lock:
            try:
                _worker.send(worker.sock, message)
            except OSError:
                pass  # the worker is gone: the dispatcher fails its call

    def _attach(self, worker):
        """A worker joins the native dispatcher as it starts: calls posted on
        its rings before it serves them wait there (a worker that dies first
        started none of them, and they are sent again), so the calls of a
        starting pool spread over all its workers."""
        dispatch = self._dispatch
        if dispatch is not None and worker.channel is not None:
            worker.generation = next(self._generations)
            dispatch.attach(worker.index, worker.channel, worker.doorbell, worker.result_map,
                            worker.generation)
        with self._attached:
            self._attached.notify_all()

    def _detach(self, worker, error):
        """Its native calls fail with `error` (as the Python path's would:
        TF's code and the exception's message); its rings end first, so that
        no native producer waits on them."""
        dispatch = self._dispatch
        if dispatch is None or getattr(worker, "generation", None) is None:
            return
        if worker.channel is not None:
            worker.channel.close()
        text = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
        # (A worker that died, or was ended for a timeout: the ring calls it
        # never started are sent anew.)
        dispatch.lost(worker.index, 2 if not isinstance(error, CallTimeoutError) else 4, text,
                      isinstance(error, (WorkerError, CallTimeoutError)))
        worker.generation = None

    def _lost(self, worker, unreadable=None):
        """`worker`'s stream ended: it is dead (reaped here).  The dispatcher
        fails the call it had started (with its timeout's error, if that
        ended it) and sends the ones it had not started to another worker;
        a fresh worker takes its slot."""
        with self._lock:
            worker.alive = False
            closing = self._closed
        if closing:
            error = PoolClosedError(f"pyfunc_bridge: {self.name} "
                                    f"{_EXIT_TEXT if _exiting else 'was closed'} while the "
                                    f"call ran in worker process {worker.pid}")
        else:  # the call told off for the timeout, if that is what ended it
            error = self._died(worker, worker.timed_out or 0, self._death(worker, unreadable))
        self._detach(worker, error)
        if not closing:  # (close() ends its workers itself)
            worker.ended()
        if self._deadlines is not None:
            self._deadlines.forget(worker)
        if not closing:
            self._replace(worker)

    def _died(self, worker, running, death):
        """The error of a call that `worker` had started when it died
        (`running`: that call as the worker showed it, shm_layout.h)."""
        if self._deadlines is None:
            return WorkerError(death)
        return self._deadlines.error(self, worker, running, death)

    def _how(self, worker, unreadable=None):
        """How `worker` ended (it is reaped here, if it was not)."""
        try:
            code = worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its socket but lives on
            worker.proc.kill()
            code = worker.proc.wait()
        if unreadable:
            return unreadable
        if code < 0:
            try:
                return f"was killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def _death(self, worker, unreadable=None):
        return (f"pyfunc_bridge: worker process {worker.pid} of {self.name} "
                f"{self._how(worker, unreadable)} while it held this call; the pool starts "
                f"a new worker, so later calls run. (A function that ends its process "
                f"(os._exit, a crash, running out of memory) fails every call that runs it.)")

    def _replace(self, dead):
        how = None if dead.ready else self._how(dead)
        with self._lock:
            if how is not None:
                self._start_failures += 1
                if self._start_failures >= _START_FAILURES:
                    self._break(f"{_START_FAILURES} in a row ended before they were ready "
                                f"(the last, worker process {dead.pid}, {how}: see its stderr)")
            broken = self._broken
        if not broken:
            self._start(dead.index)

    def _start(self, index):
        """Starts the worker of slot `index` (the dispatcher posts the calls
        that wait to it once it is attached)."""
        try:
            fresh = _Worker(self, index)
        except BaseException as exc:  # noqa: BLE001 - recorded for the callers
            with self._lock:
                self._break(f"a worker could not be started ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            self._workers[index] = fresh
            closed = self._closed
        if not closed:
            self._attach(fresh)
        self._counters.count_worker_replaced()
        if closed:
            self._stop([fresh])

    def _break(self, why):
        """Marks the pool broken (the pool's lock is held): calls fail, saying
        `why`, until the first one after the back-off (doubled each time, to
        _RETRY_MAX_SECONDS) starts workers again (_revive).  Callers that
        wait for a worker (ring_call) wake to see it."""
        delay = _RETRY_SECONDS if self._retry_delay is None else min(
            2 * self._retry_delay, _RETRY_MAX_SECONDS)
        self._retry_delay = delay
        self._retry_at = time.monotonic() + delay
        self._broken = (f"pyfunc_bridge: {self.name} cannot start worker processes: {why}. "
                        f"Calls fail until then: the pool tries again on the first call "
                        f"{delay:g} s after this")
        with self._attached:
            self._attached.notify_all()

    def _revive(self):
        """A broken pool past its back-off starts the workers it lost (the
        caller's call then goes to one of them)."""
        with self._lock:
            if self._closed or not self._broken or time.monotonic() < self._retry_at:
                return
            self._broken = None
            self._start_failures = 0
            dead = [w.index for w in self._workers if not w.alive]
        for index in dead:
            self._start(index)

    # --------------------------------------------------------------- close --

    def __del__(self):
        if ((not getattr(self, "_closed", True) or getattr(self, "_closing", False))
                and hasattr(self, "_workers")):
            self.close()  # dropped without close() (or mid-close): its workers end with it

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
                workers = list(self._workers)
            self._finish_close(workers)
            self._closing = False

    def _finish_close(self, workers):
        """close()'s work, each step safe to run again after an interruption."""
        when = _EXIT_TEXT if _exiting else "was closed"
        with self._attached:
            self._attached.notify_all()  # callers waiting for a worker see the close
        self._stop(workers)
        if self._dispatch is not None:
            for w in workers:
                self._detach(w, PoolClosedError(f"pyfunc_bridge: {self.name} {when} while "
                                                f"the call ran in worker process {w.pid}"))
            # Its reply threads have ended; it held the input mapping.
            self._dispatch = None
        if self._deadlines is not None:
            self._deadlines.close()
        if self._input_fd is not None:
            os.close(self._input_fd)
            self._input_fd = None
        # The input mapping goes with the last reference to it (a Route.call
        # still copying holds the dispatcher); result mappings, see _Worker.ended.
        self._input_map = None
        _live_pools.discard(self)

    def _stop(self, workers):
        for w in workers:
            try:
                w.sock.shutdown(socket.SHUT_RDWR)  # the worker reads the end of its stream
            except OSError:
                pass
        deadline = time.monotonic() + _CLOSE_GRACE_SECONDS
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()  # still in a function
                w.proc.wait()
        for w in workers:
            if w.reader is not threading.current_thread():
                w.reader.join(timeout=5)
            w.ended()


class _RingAnswers:
    """Answers of native calls that went by a worker's socket (no room in
    its result arena: shm_layout.h, PFB_POOL_STATUS_SOCKET), by call id (ids
    are unique in the process), from the reader threads to native_reply."""

    def __init__(self):
        self._answers = {}
        self._arrived = threading.Condition()

    def put(self, call_id, answer):
        with self._arrived:
            self._answers[call_id] = answer
            self._arrived.notify_all()

    def take(self, call_id, pool_name):
        # The worker wrote it before the DONE: its reader has it or reads it
        # next (a dead worker's stream is read to its end first).
        deadline = time.monotonic() + _RING_ANSWER_SECONDS
        with self._arrived:
            while call_id not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(f"pyfunc_bridge: a worker of {pool_name} sent a call's "
                                      f"answer by its socket, and it never arrived")
                self._arrived.wait(min(left, 0.25))
            return self._answers.pop(call_id)


_ring_answers = _RingAnswers()
_RING_ANSWER_SECONDS = 60.0


def native_reply(pool_name, address, writable=False, counters=None):
    """_answer's answer (result, bytes moved, copy facts) for a call the kernel
    ran natively (`address`: its PfbDispatchCall, DONE) whose reply the
    kernel does not turn into outputs itself: the function raised, a value
    came back pickled, a result is not what the op declares (the
    conversion layer's checks then raise as for any result), or copy=False
    may refuse it (the copy facts, per result, come from its record's flags:
    shm_layout.h, PFB_POOL_TENSOR_ALIASED ..).  Takes its
    result blocks: arrays over them hand them back when they go, a pickled
    value's and an error's go back once read.  The kernel's route counted
    the call for the pool; `counters` (the pool's record) get its results'
    share here, as for ring_call's calls (`writable`: copy=True, which saves
    no copy)."""
    return _answer(pool_name, _worker.pool_module().native_reply(address), writable, counters)


def _answer(pool_name, reply, writable, counters):
    """(result, bytes moved, copy facts per result) of a DONE (the worker
    module's Reply, which holds its
    result blocks until each is claimed): native_reply's, and ring_call's."""
    pw = _worker.pool_module()
    from pyfunc_bridge import _library
    result_view = _library.conversion().worker_result
    message = reply.message
    read_block = reply.read

    def loads(data):
        try:
            return pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - this call's error; the worker lives on
            raise WorkerError(f"pyfunc_bridge: a worker of {pool_name} sent a reply this "
                              f"process cannot unpickle ({type(exc).__name__}: {exc})") from exc

    def count(bytes_out, saved):
        if counters is not None and _pool_stats.counting():
            counters.add_results(bytes_out, 0 if writable else saved)

    if message.status == pw.STATUS_SOCKET:
        ok, data, facts = _ring_answers.take(message.call_id, pool_name)
        if ok:
            value = loads(data)
            several = type(value) in (list, tuple)
            count(sum(map(_pool_stats.data_bytes, value if several else [value])), 0)
            return value, 0, facts
        _raise_acyclic(_worker_exception(pickle.loads(data)))
    if message.status != pw.STATUS_OK:
        offset, size = message.block
        _raise_acyclic(
            _worker_exception(pickle.loads(read_block(offset, size))) if size
            else RuntimeError(f"pyfunc_bridge: a worker of {pool_name} failed a call "
                              f"and could not send its error (no room in its arena)"))
    values, facts = [], []
    bytes_out = saved = moved = 0
    for code, bits, lanes, flags, offset, size, shape in message.items:
        if flags & pw.TENSOR_PICKLED:
            values.append(loads(read_block(offset, size)))
            bytes_out += _pool_stats.data_bytes(values[-1])
        else:  # numbers: a view of the block (strings come back pickled)
            dtype = pw.np_dtype(code, bits)
            values.append(reply.view(result_view, offset, size, dtype, tuple(shape))
                          if size else np.zeros(shape, dtype))
            bytes_out += values[-1].nbytes
            # As the kernel counts (pool_route.cc): a 0-d record the worker
            # copied is a NumPy scalar's bytes, which saves no copy.
            if size and (shape or flags & pw.TENSOR_SHARED):
                saved += 1
                moved += 0 if flags & pw.TENSOR_SHARED else values[-1].nbytes
        facts.append(pw.flags_facts(flags))
    count(bytes_out, saved)
    if message.flags == pw.DONE_ONE and len(values) == 1:
        return values[0], moved, facts
    return (values if message.flags == pw.DONE_LIST else tuple(values)), moved, facts


def _dispatch_error(code, text):
    """The exception of a call the dispatcher failed (its worker died, or the
    pool closed): `text` is the one the pool gave it (_detach), "module.Class:
    message", rebuilt as that class where it is one of the pool's."""
    name, _, message = text.partition(": ")
    for cls in (WorkerError, PoolClosedError, CallTimeoutError):
        if name == f"{cls.__module__}.{cls.__qualname__}":
            return cls(message)
    return WorkerError(text)


def _raise_acyclic(error):
    """Raises `error` with no frame of its traceback holding it: the error's
    traceback holds the frames it passes, and a frame that held the error
    too would make a cycle, which kept the pool, the caller's frames and the
    results they hold (their workers' shared memory) until the next garbage
    collection.  Pass the error as an expression, or clear the caller's
    local: this frame clears its own."""
    try:
        raise error
    finally:
        error = None


def _worker_exception(payload):
    """The exception a worker raised, rebuilt here (or as its builtin base
    class with the same message), with the worker's traceback as its cause."""
    data, base, summary, text = payload
    exc = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:  # noqa: BLE001 - rebuilt from its base class below
            exc = None
    if not isinstance(exc, BaseException):
        exc = getattr(builtins, base, Exception)(summary)
    exc.__cause__ = WorkerTraceback(text)
    return exc


# ------------------------------------------------------------- executors --

_live_pools = weakref.WeakSet()
_memfd_names = set()  # the names of every pool's memfds (_pool_fork)
_default = None
_default_lock = threading.Lock()


def _after_fork_in_child():
    """A forked child has none of the parent's pools (their workers serve
    the parent): they are closed here without touching them, and
    executor="process" starts a fresh default pool on first use."""
    global _default, _default_lock
    for pool in list(_live_pools):
        pool._forked()
    _live_pools.clear()  # this process's atexit hook must not close them
    # Their shared memory (and that of pools closed since, which results
    # may still view) becomes the child's own.
    _pool_fork.forget_shared_memory(_memfd_names)
    _default = None
    _default_lock = threading.Lock()


os.register_at_fork(before=lambda: _pool_fork.before_fork(_memfd_names),
                    after_in_parent=_pool_fork.after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class _DefaultPool:
    """executor="process": the process's shared pool, started on first use.
    Each call resolves it once (ring_call), so a default pool replaced
    meanwhile by another thread (closed, then started anew) never sees a
    call that began in the old one."""

    def ring_call(self, func, framework, args, writable, scalars, facts=False):
        return default_pool().ring_call(func, framework, args, writable, scalars, facts)

    def native_reply(self, address, writable):
        # (Pools of one name share a record: the default pool's, whichever ran it.)
        return native_reply(repr(self), address, writable,
                            _pool_stats.record(_DEFAULT_POOL_NAME))

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
            raise PoolClosedError(f"pyfunc_bridge: the default ProcessPool {_EXIT_TEXT}")
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
        if value.closed:
            fix = "; pass an open ProcessPool" if value._forked_into is None else ""
            raise ValueError(f"{api}: executor {value!r} {value._why_closed()}{fix}")
        return value
    if isinstance(value, str) and value == "process":
        return DEFAULT
    raise ValueError(
        f"{api}: executor must be None (in this process), \"process\" (the shared "
        f"default pool) or a pfb.ProcessPool, got {value!r}")


_exiting = False
_EXIT_TEXT = "was closed at interpreter exit"


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
                    and _EXIT_TEXT in str(args.exc_value)):
                return
            previous(args)
        threading.excepthook = excepthook
    for pool in list(_live_pools):
        pool.close()
