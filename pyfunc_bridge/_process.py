"""Process workers: ``ProcessPool`` and the ``executor=`` of numpy_function,
py_func and array_function.

A pool runs functions in worker processes (pyfunc_bridge/_worker.py, a
script that imports NumPy and the user's function, never TensorFlow), so
that Python code that holds the GIL runs on as many cores as there are
workers.  The conversion layer's ``_ProcessConverter``
(src/conversion/process.pxi) calls ``stage`` (inputs into shared memory) and
``run`` (submit, wait without the GIL, decode the results) from the bridge's
one driver.

Memory: one input arena per pool and one result arena per worker, each
``arena_bytes`` of shared memory (``memfd``: anonymous, so nothing is left in
/dev/shm whatever happens to the processes).  Inputs wait for room in the
input arena; a payload larger than an arena, and a result that finds its
worker's arena full, travel pickled through the socket instead.  A block
goes back only when the process it was handed to says it is done with it
(pyfunc_bridge/_worker.py says who owns a block when): an input block when
nothing in the worker views it any more, a result block when its tensor goes.

Traffic: each worker has one socket.  A caller appends its request to the
worker's outbox and the first caller that finds no write under way writes
every waiting request in one frame; the worker runs all it read and answers
them in one frame; the pool's reader thread for that worker wakes the
callers.  A function travels once per worker (pickled by _pickling's rule:
by value when its module imports TensorFlow, else as cloudpickle does), then
its token does.
"""
import atexit
import builtins
import itertools
import math
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

import numpy as np

from pyfunc_bridge import _pickling, _pool_stats, _worker

DEFAULT_ARENA_BYTES = 64 << 20
_CLOSE_GRACE_SECONDS = 1.0   # then a worker still running a function is killed
_START_FAILURES = 3          # workers in a row that die before they are ready


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


def _take(items):
    """Empties a list that other threads append to; returns what it held."""
    taken = items[:]
    del items[:len(taken)]
    return taken


_MAIN_THREAD = threading.main_thread().ident


class _Uninterrupted:
    """Holds KeyboardInterrupt back while a call's blocks change hands, and
    raises it on leaving, once every block has an owner that will give it
    back (a block handed to no one would never come back; a block freed
    while a worker still uses it would give another call's input).

    Only the main thread runs signal handlers, so only there is SIGINT's
    handler (the one that raises KeyboardInterrupt, or the user's) swapped
    for one that notes the signal; what it noted runs the old handler on
    leaving.  Waits for a worker's reply or for room stay outside, so that
    Ctrl-C still stops a caller that waits."""
    __slots__ = ("_previous", "_caught")

    def __enter__(self):
        self._previous = None
        if threading.get_ident() == _MAIN_THREAD:
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._caught = None
                signal.signal(signal.SIGINT, self._note)
                self._previous = previous
        return self

    def _note(self, signum, frame):
        self._caught = (signum, frame)

    def __exit__(self, *exc):
        previous = self._previous
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if self._caught is not None:
                previous(*self._caught)  # KeyboardInterrupt, as if it came now
        return False


_CALLER, _READER = "caller", "reader"


class _Call:
    """One call in flight: its caller waits on `lock`, which the reader
    releases after setting `reply`.  `holds`: whether the call holds input
    blocks until its reply (the pool's count of such calls, `_holding`).

    `claims` decides, race-free, who disposes of the reply: the reader
    appends when the reply arrives, a caller that stops waiting (Ctrl-C)
    when it gives up; whoever is first there leaves the reply to the other
    (list.append is atomic).  So the result blocks of an abandoned call go
    back to its worker whichever comes first.

    `queued_at` and `timing` (the worker's (started, finished)) are the
    pool's statistics: time.monotonic(), a clock all processes share on Linux."""
    __slots__ = ("lock", "reply", "holds", "claims", "queued_at", "timing")

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.reply = None
        self.holds = False
        self.claims = []
        self.queued_at = time.monotonic()
        self.timing = None


class _Worker:
    """The parent's side of one worker process."""

    def __init__(self, pool, index):
        self.index = index
        self.pending = {}     # call id -> _Call, until its reply or the worker's end
        self.outbox = []      # requests not yet written
        self.freed = []       # result blocks the parent no longer holds (process.pxi appends)
        self.inputs = {}      # offset -> size: input blocks handed to this worker, until it frees them
        self.forget = []      # tokens of functions the parent dropped
        self.known = set()    # tokens this worker has the function of
        self.write_lock = threading.Lock()
        self.alive = True
        self.ready = False
        result_fd, self.result_map = _shared_memory(pool.arena_bytes, f"{pool.name}-results")
        # The address the conversion layer's views start from; the array keeps
        # the mapping alive for as long as a result block (and so this object) is held.
        self.results = (np.frombuffer(self.result_map, np.uint8)
                        if self.result_map is not None else None)
        self.results_base = self.results.ctypes.data if self.results is not None else 0
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [child.fileno(), pool._input_fd or -1, result_fd or -1]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, _worker.__file__, *map(str, fds)],
                pass_fds=[fd for fd in fds if fd >= 0], cwd=os.getcwd(),
                stdin=subprocess.DEVNULL)
        finally:
            child.close()
            if result_fd is not None:
                os.close(result_fd)
        self.sock = parent
        self.pid = self.proc.pid
        parent.sendall(_worker.frame(
            {"path": list(sys.path), "input_bytes": pool.arena_bytes if pool._input_fd else 0,
             "result_bytes": pool.arena_bytes, "name": pool.name}, pickle.dumps))
        self.reader = threading.Thread(target=pool._read, args=(self,), daemon=True,
                                       name=f"{pool.name} reader {index}")
        self.reader.start()


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
            for worker in list(pool._workers):
                if token in worker.known:
                    worker.known.discard(token)
                    worker.forget.append(token)


def _pickle_function(func):
    try:  # by value or by name: _pickling's rule
        return _pickling.dumps(func, _worker._PICKLE_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"executor: the function {func!r} cannot be sent to a worker process "
            f"({type(exc).__name__}: {exc}); it probably captures an object that cannot "
            f"cross processes (a lock, a file, a session). Create that object inside "
            f"the function, or run it in-process (executor=None)") from exc


class ProcessPool:
    """Worker processes that run ``numpy_function`` / ``py_func`` /
    ``array_function`` calls outside this process, so that Python code that
    holds the GIL runs on several cores (pass it as ``executor=``).

    Args:
      workers: how many processes (default: one per core this process may use).
      arena_bytes: the shared memory for inputs, and again for each worker's
        results (default 64 MiB): the pool maps at most
        ``(workers + 1) * arena_bytes``.  Inputs wait for room; a payload
        larger than an arena, or a result when its worker's arena is full,
        travels pickled through the worker's socket instead (slower, still
        correct).
      name: the pool's name in errors (default ``ProcessPool-<n>``).

    Workers are fresh interpreters (``sys.executable``, never a fork of this
    process) with this process's ``sys.path`` and working directory; they
    import NumPy and the functions they run, not TensorFlow.  A function
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

    def __init__(self, workers=None, *, arena_bytes=DEFAULT_ARENA_BYTES, name=None):
        if workers is None:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        if type(workers) is not int or workers < 1:
            raise ValueError(f"workers must be a positive int or None (one per core), "
                             f"got {workers!r}")
        if type(arena_bytes) is not int or arena_bytes < 0:
            raise ValueError(f"arena_bytes must be a non-negative int, got {arena_bytes!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        self.name = name or f"ProcessPool-{next(ProcessPool._numbers)}"
        self.workers = workers
        self.arena_bytes = arena_bytes
        self._lock = threading.Condition()
        self._closed = False
        self._broken = None        # why no worker can start, once that is clear
        self._start_failures = 0
        self._ids = itertools.count()
        self._functions = _Functions(self)
        self._counters = _pool_stats.record(self.name)  # pfb.stats().pools[name]
        self._input_fd, self._input_map = _shared_memory(arena_bytes, f"{self.name}-inputs")
        self._inputs = (np.frombuffer(self._input_map, np.uint8)
                        if self._input_map is not None else None)
        self._arena = _worker.Arena(arena_bytes)
        self._arena_free = threading.Condition()  # guards _arena, _holding, workers' inputs
        # Calls staged and not yet answered that hold input blocks: blocks
        # they will free or keep.  At 0, waiting for room would wait for ever
        # (functions keep the rest): a call takes the room that is free now.
        self._holding = 0
        self._workers = []
        _live_pools.add(self)
        try:
            for i in range(workers):
                self._workers.append(_Worker(self, i))
        except BaseException:
            self.close()
            raise

    def __repr__(self):
        state = "closed" if self._closed else f"{self.workers} workers"
        return f"<pyfunc_bridge.ProcessPool {self.name!r} ({state})>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return self._closed

    def pids(self):
        """The process ids of the current workers."""
        return [w.pid for w in self._workers if w.alive]

    # ------------------------------------------------ the converter's side --

    def stage(self, args):
        """One description per input (the values _input_arrays made): numbers
        are copied into the input arena, everything else is pickled."""
        numbers = [i for i, value in enumerate(args)
                   if type(value) is np.ndarray and value.dtype.kind not in "OSUMm"
                   and value.size and self._inputs is not None]
        descs = [("v", value) for value in args]
        try:
            self._alloc(args, numbers, descs)
            for value, desc in zip(args, descs):
                if desc[0] == "s":
                    target = self._inputs[desc[1]:desc[1] + value.nbytes]
                    np.copyto(target.view(value.dtype).reshape(value.shape), value)
        except BaseException:
            self.release(descs)
            raise
        return descs

    def release(self, descs):
        """Returns the input blocks of `descs` to the arena and empties it: the
        blocks of a call that no worker received (run() empties `descs` when it
        hands the call to a worker, whose blocks then come back as it frees them)."""
        if not any(d[0] == "s" for d in descs):
            descs.clear()
            return
        with _Uninterrupted():
            blocks = [(d[1], d[2]) for d in descs if d[0] == "s"]
            descs.clear()
            with self._arena_free:
                for offset, size in blocks:
                    self._arena.free(offset, size)
                self._holding -= 1
                self._arena_free.notify_all()

    def _alloc(self, args, numbers, descs):
        """Places the inputs `numbers` (indices into `args`) in the arena,
        taken together: writes ("s", offset, size, dtype, shape) into `descs`
        for each that gets a block (the caller's to release from then on);
        one that does not keeps its ("v", value) and travels pickled.  A call
        holds no block while it waits for room (calls that each held part of
        their inputs and waited for the rest would wait for each other for
        ever).  When no call in flight holds blocks, the room there is now is
        all there will be (functions keep the rest): what does not fit
        travels pickled."""
        if not numbers:
            return
        sizes = [args[i].nbytes for i in numbers]
        with self._arena_free:
            while True:
                if self._closed:
                    raise PoolClosedError(f"pyfunc_bridge: {self.name} is closed")
                with _Uninterrupted():  # from taking the blocks to writing them down
                    idle = not self._holding
                    blocks = [self._arena.alloc(n) if n <= self.arena_bytes else None
                              for n in sizes]
                    if idle or all(block is not None or n > self.arena_bytes
                                   for block, n in zip(blocks, sizes)):
                        if any(block is not None for block in blocks):
                            self._holding += 1
                        for i, block in zip(numbers, blocks):
                            if block is not None:
                                descs[i] = ("s", *block, args[i].dtype, args[i].shape)
                        return
                    for block in blocks:
                        if block is not None:
                            self._arena.free(*block)
                self._arena_free.wait()  # calls in flight free or keep their inputs

    def run(self, func, framework, descs, writable):
        """Runs `func` on the staged inputs in a worker; returns (result,
        bytes the worker wrote to shared memory).  Waits with the GIL released.

        A caller that stops waiting (KeyboardInterrupt) abandons the call: its
        blocks go back when the worker is done with them, never before."""
        call = _Call()
        inputs = descs[:]  # for the statistics: _submit hands descs over
        try:
            self._submit(call, func, framework, descs, writable)
            call.lock.acquire()  # releases the GIL while it waits
            if call.timing is not None and _pool_stats.counting():
                self._count_call(call, inputs, writable)
            with _Uninterrupted():  # the reply's result blocks get their owners
                ok, payload, moved, worker = call.reply
                call.reply = None  # taken: nothing left for _abandon to dispose of
                if ok:
                    return self._decode(payload, worker), moved
            raise payload if ok is None else _worker_exception(payload)
        except BaseException:
            self._abandon(call)
            raise
        finally:
            self.release(descs)  # the blocks of a call that did not reach a worker

    def _count_call(self, call, inputs, writable):
        """Adds an answered call (its reply not yet taken) to the pool's
        statistics."""
        ok, payload, _, _ = call.reply
        started, finished = call.timing
        items = [] if not ok else [payload[1]] if payload[0] == "one" else payload[1]
        shared = sum(1 for item in items if item[0] == "s")
        self._counters.add_call(
            max(0.0, started - call.queued_at), max(0.0, finished - started),
            sum(_desc_bytes(d) for d in inputs), sum(_desc_bytes(i) for i in items),
            0 if writable else shared)

    def _submit(self, call, func, framework, descs, writable):
        """Hands `call` to a worker: the request and its input blocks become
        the worker's (`descs` is emptied), all at once."""
        token, pickled = self._functions.get(func)
        blocks = {d[1]: d[2] for d in descs if d[0] == "s"}
        call_id = next(self._ids)
        with _Uninterrupted():
            with self._lock:
                worker = self._pick()
                call.holds = bool(blocks)
                worker.pending[call_id] = call
                known = token in worker.known
                worker.known.add(token)
                # Under the lock: a request that finds the token known must not
                # reach the worker before the one that carries the function.
                worker.outbox.append(
                    (call_id, token, None if known else pickled, framework, descs[:], writable))
                worker.inputs.update(blocks)  # under the lock: _lost takes them once not alive
                descs.clear()
            self._flush(worker)  # a frame cut short would garble the stream

    def _abandon(self, call):
        """The caller stopped waiting: whoever comes second, this caller or
        the reader thread with the reply, disposes of the reply's result
        blocks (see _Call)."""
        with _Uninterrupted():
            call.claims.append(_CALLER)
            if call.claims[0] is _READER:  # the reply came: not taken yet, or taken
                reply, call.reply = call.reply, None
                if reply is not None:
                    _discard(reply)

    def _answer(self, call, reply):
        """The reader thread hands `reply` to the caller, or disposes of it
        when the caller has abandoned the call."""
        call.reply = reply
        call.claims.append(_READER)
        if call.claims[0] is _READER:
            call.lock.release()
        else:
            call.reply = None
            _discard(reply)

    def _pick(self):
        """The live worker with the fewest calls (the pool's lock is held)."""
        while True:
            if self._closed:
                raise PoolClosedError(f"pyfunc_bridge: {self.name} is closed")
            if self._broken:
                raise WorkerError(self._broken)
            alive = [w for w in self._workers if w.alive]
            if alive:
                return min(alive, key=lambda w: len(w.pending))
            self._lock.wait()  # a replacement is starting

    def _flush(self, worker):
        """Writes every waiting request in one frame, unless another caller's
        write is under way (that writer takes ours too)."""
        while worker.outbox:
            if not worker.write_lock.acquire(blocking=False):
                return
            try:
                requests = _take(worker.outbox)
                message = (_take(worker.freed), _take(worker.forget), requests)
                try:
                    worker.sock.sendall(_worker.frame(message, pickle.dumps))
                except OSError:
                    pass  # the worker is gone: its reader fails these calls
            finally:
                worker.write_lock.release()

    def _decode(self, payload, worker):
        from pyfunc_bridge import _library
        result_view = _library.conversion().worker_result

        def value(item):
            if item[0] == "v":
                return item[1]
            _, offset, size, dtype, shape = item
            return result_view(worker, offset, size, dtype, shape)

        kind, body = payload
        if kind == "one":
            return value(body)
        items = [value(item) for item in body]
        return items if kind == "list" else tuple(items)

    # ------------------------------------------------------ reader threads --

    def _read(self, worker):
        """The reader thread of one worker: wakes the callers of its replies;
        at the end of the stream, fails the calls it still held."""
        frames = _worker.FrameReader(worker.sock)
        try:
            while True:
                received = frames.read(pickle.loads)
                if not received:
                    break
                for message in received:
                    if message[0] == "ready":  # ("ready", pid)
                        worker.ready = True
                        self._start_failures = 0
                        continue
                    _, replies, freed = message
                    answered = [(worker.pending.pop(call_id, None), (ok, payload, moved, worker),
                                 timing)
                                for call_id, ok, payload, moved, *timing in replies]
                    self._settle(worker, freed, [call for call, _, _ in answered])
                    for call, reply, timing in answered:
                        if call is not None:
                            call.timing = timing[0] if timing else None  # (started, finished)
                            self._answer(call, reply)
        except (OSError, EOFError):
            pass
        except Exception as exc:  # noqa: BLE001 - a reply this process cannot load
            # Its calls are unknown and the stream is lost: end the worker, so
            # that every call it held fails rather than waits for ever.
            worker.proc.kill()
            self._lost(worker, f"sent a reply this process cannot unpickle "
                               f"({type(exc).__name__}: {exc}), so it was ended")
            return
        self._lost(worker)

    def _settle(self, worker, freed, answered):
        """The input blocks `worker` freed go back to the arena; the calls
        `answered` (None: an unknown id) no longer hold blocks in flight (the
        blocks their functions kept are the worker's until it frees them)."""
        with self._arena_free:
            for offset, size in freed:
                if worker.inputs.pop(offset, None) == size:  # (never a block it does not hold)
                    self._arena.free(offset, size)
            self._holding -= sum(1 for call in answered if call is not None and call.holds)
            self._arena_free.notify_all()

    def _lost(self, worker, unreadable=None):
        with self._lock:
            worker.alive = False
            held = list(worker.pending.values())
            worker.pending.clear()
            closing = self._closed
        if closing:
            when = _EXIT_TEXT if _exiting else "was closed"
            error = PoolClosedError(f"pyfunc_bridge: {self.name} {when} while the call "
                                    f"ran in worker process {worker.pid}")
        else:
            error = WorkerError(self._death(worker, unreadable))
        # The process is gone (reaped above, or being ended by close()): the
        # blocks it held are nobody's.
        self._settle(worker, list(worker.inputs.items()), held)
        for call in held:
            self._answer(call, (None, error, 0, worker))
        if not closing:
            self._replace(worker)

    def _death(self, worker, unreadable=None):
        try:
            code = worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its socket but lives on
            worker.proc.kill()
            code = worker.proc.wait()
        if unreadable:
            how = unreadable
        elif code < 0:
            try:
                how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return (f"pyfunc_bridge: worker process {worker.pid} of {self.name} {how} while it "
                f"held this call; the pool starts a new worker, so later calls run. (A "
                f"function that ends its process (os._exit, a crash, running out of "
                f"memory) fails every call that runs it.)")

    def _replace(self, dead):
        with self._lock:
            if not dead.ready:
                self._start_failures += 1
                if self._start_failures >= _START_FAILURES:
                    self._broken = (
                        f"pyfunc_bridge: {self.name} cannot start worker processes: "
                        f"{_START_FAILURES} in a row ended before they were ready (the "
                        f"last: {self._death(dead)}); see their stderr")
                    self._lock.notify_all()
                    return
        try:
            fresh = _Worker(self, dead.index)
        except BaseException as exc:  # noqa: BLE001 - recorded for the callers
            with self._lock:
                self._broken = f"pyfunc_bridge: {self.name} cannot start a worker: {exc}"
                self._lock.notify_all()
            return
        with self._lock:
            self._workers[dead.index] = fresh
            closed = self._closed
            self._lock.notify_all()
        self._counters.count_worker_replaced()
        if closed:
            self._stop([fresh])

    # --------------------------------------------------------------- close --

    def close(self):
        """Ends the workers and frees the shared memory; calls in flight fail
        with PoolClosedError.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
            self._lock.notify_all()
        with self._arena_free:
            self._arena_free.notify_all()
        self._stop(workers)
        if self._input_fd is not None:
            os.close(self._input_fd)
            self._input_fd = None
        _live_pools.discard(self)

    def _stop(self, workers):
        import time
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
            w.sock.close()


def _discard(reply):
    """Gives the result blocks of a reply that no caller takes back to their
    worker (with the pool's next message to it)."""
    ok, payload, _, worker = reply
    if ok:
        kind, body = payload
        for item in ([body] if kind == "one" else body):
            if item[0] == "s":
                worker.freed.append((item[1], item[2]))


def _desc_bytes(desc):
    """The data bytes of an input or result description ("s": a block;
    "v": a pickled value)."""
    if desc[0] == "s":
        return np.dtype(desc[3]).itemsize * math.prod(desc[4])
    return _pool_stats.data_bytes(desc[1])


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
_default = None
_default_lock = threading.Lock()


class _DefaultPool:
    """executor="process": the process's shared pool, started on first use."""

    def stage(self, args):
        return default_pool().stage(args)

    # release and run find the pool that staged the inputs (stage made it):
    # a pool started in between would read other memory at their offsets.
    # Closed since, it fails the call with PoolClosedError.

    def release(self, descs):
        if _default is not None:
            _default.release(descs)

    def run(self, func, framework, descs, writable):
        pool = _default
        if pool is None:
            raise PoolClosedError(f"pyfunc_bridge: {self!r} was closed")
        return pool.run(func, framework, descs, writable)

    def __repr__(self):
        return "'process' (the shared default ProcessPool)"


DEFAULT = _DefaultPool()


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
                _default = ProcessPool(name="the default ProcessPool")
            pool = _default
    return pool


def executor(value, api):
    """The pool an `executor=` argument names: None (in-process), DEFAULT, or a
    ProcessPool; raises for anything else."""
    if value is None or value is DEFAULT:
        return value
    if isinstance(value, ProcessPool):
        if value.closed:
            raise ValueError(f"{api}: executor {value!r} is closed; pass an open ProcessPool")
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
