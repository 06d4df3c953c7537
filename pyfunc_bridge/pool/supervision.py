"""Supervision of a pool's workers: ``Supervisor``, an object each
ProcessPool owns (pool/process_pool.py).  It starts each worker, runs its
reader thread, attaches it to the dispatcher, sees its death and replaces
it, backs off while workers cannot start, stops them at close, and lets go
of them in a forked child."""
import itertools
import os
import signal
import socket
import subprocess
import threading
import time
import weakref

from pyfunc_bridge.pool.answers import ring_answers
from pyfunc_bridge.pool.errors import CallTimeoutError, WorkerError, error_code
from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.pool.worker_process import WorkerProcess, close_fd
from pyfunc_bridge.worker.frames import FrameReader, send

_CLOSE_GRACE_SECONDS = 1.0   # then a worker still running a function is killed
_START_FAILURES = 3          # workers in a row that die before they are ready
_RETRY_MAX_SECONDS = 60.0    # (the back-off doubles while it keeps failing, up to this)


class Supervisor:
    """The workers of one pool, which owns this object.

    What the pool calls: ``start(index, first)`` (a slot's worker);
    ``workers``; ``broken`` (why no worker can start, or
    None) and ``revive()`` (past the back-off, start the lost workers
    again); ``wait_for_worker(seconds)`` (a call that found none attached);
    ``close(workers)``; ``forked(lock)`` (in a forked child).

    The steps of a worker's life, which tests may wrap: ``attach(worker)``
    (it joins the dispatcher), ``lost(worker, unreadable)`` (its stream
    ended), ``death(worker, unreadable)`` (reaps it: the error's text),
    ``replace(dead)``; and ``retry_seconds``, the first back-off.

    What it reads of the pool (weakly: a pool dropped without close() is
    collected): its ``name``, ``_closed`` and ``_closed_error(worker)``,
    its dispatcher, payloads, deadlines and counters.  ``lock`` is the
    pool's: it guards the pool's ``_closed`` and this object's workers and
    back-off together."""

    retry_seconds = 1.0  # calls fail this long after workers could not start

    def __init__(self, pool, lock):
        self._pool = weakref.ref(pool)  # (called: the pool, or None once collected)
        self.lock = lock
        self.workers = []          # WorkerProcess per slot, in slot order
        self.broken = None         # why no worker can start, once that is clear
        self.retry_at = 0.0        # when a broken pool may try again (time.monotonic)
        self._retry_delay = None   # the last back-off (None: none since a worker was ready)
        self._start_failures = 0   # workers in a row that ended before they were ready
        self._starting = False     # a worker's start runs (on the spawning thread, start)
        self._attached = threading.Condition()  # a worker joined the dispatcher
        self._generations = itertools.count(1)  # a worker slot's attachments

    def wait_for_worker(self, seconds):
        """Waits until a worker attaches, the pool breaks or closes, or `seconds`."""
        with self._attached:
            self._attached.wait(seconds)

    def forked(self, lock):
        """In a forked child, at once: the pool is its parent's.  Its workers
        and their sockets are the parent's (a write here would garble the
        parent's stream, a shutdown or a kill would end its workers): this
        process's copies of their descriptors are closed without a word to
        them.  Its locks may have been held by a thread that the fork did
        not copy: they are made anew (`lock`, the pool's new one)."""
        self.lock = lock
        self._attached = threading.Condition()
        for worker in self.workers:
            worker.alive = False
            # The socket object must not close the fd (-1 once closed: a dead
            # worker's number may be another file's by now) ...
            sock_fd = worker.sock.detach()
            # The rings are the parent's too: dropped here, never closed
            # (closing writes to the shared control segment).
            worker.channel = None
            for fd in (sock_fd, worker.trace_fd, worker.doorbell):
                if fd is not None and fd >= 0:
                    try:
                        os.close(fd)  # ... this process's copy, closed here
                    except OSError:
                        pass

    # ----------------------------------------------------- reader threads --

    def _receive(self, worker, received):
        """Handles the messages of one read; False at the end of the stream."""
        for message in received:
            kind = message[0]
            if kind == "ring":  # ("ring", call_id, ok, payload, facts): decode_answer's
                ring_answers.put(message[1], message[2:])
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
        message = ("payload", payload_id, self._pool()._payloads.get(payload_id))
        with worker.write_lock:
            try:
                send(worker.sock, message)
            except OSError:
                pass  # the worker is gone: the dispatcher fails its call

    # ------------------------------------------------- a worker's life --

    def attach(self, worker):
        """A worker joins the native dispatcher as it starts: calls posted on
        its rings before it serves them wait there (a worker that dies first
        started none of them, and they are sent again), so the calls of a
        starting pool spread over all its workers."""
        dispatch = self._pool()._dispatch
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
        dispatch = self._pool()._dispatch
        if dispatch is None or worker.generation is None:
            return
        if worker.channel is not None:
            worker.channel.close()
        text = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
        # (A worker that died, or was ended for a timeout: the ring calls it
        # never started are sent anew.)
        dispatch.lost(worker.index, error_code(error), text,
                      isinstance(error, (WorkerError, CallTimeoutError)))
        worker.generation = None

    def lost(self, worker, unreadable=None):
        """`worker`'s stream ended: it is dead (reaped here).  The dispatcher
        fails the call it had started (with its timeout's error, if that
        ended it) and sends the ones it had not started to another worker;
        a fresh worker takes its slot."""
        pool = self._pool()
        with self.lock:
            worker.alive = False
            closing = pool._closed
        if closing:
            error = pool._closed_error(worker)
        else:  # (death reaps it first: a timed-out worker's stack is then written)
            death = self.death(worker, unreadable)
            error = (WorkerError(death) if worker.timed_out is None
                     else pool._deadlines.error(pool, worker))
        self._detach(worker, error)
        close_fd(worker, "trace_fd")  # (a pool with a timeout's: its stack was read)
        if not closing:  # (close() ends its workers itself)
            worker.ended()
            self.replace(worker)

    def _how(self, worker, unreadable=None):
        """How `worker` ended (it is reaped here, if it was not)."""
        try:
            code = worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its socket but lives on
            code = worker.kill_and_reap()
        if unreadable:
            return unreadable
        if code < 0:
            try:
                return f"was killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def death(self, worker, unreadable=None):
        """The WorkerError's text of a call `worker` held when it died (reaped here)."""
        return (f"pyfunc_bridge: worker process {worker.pid} of {self._pool().name} "
                f"{self._how(worker, unreadable)} while it held this call; the pool starts "
                f"a new worker, so later calls run. (A function that ends its process "
                f"(os._exit, a crash, running out of memory) fails every call that runs it.)")

    def replace(self, dead):
        how = None if dead.ready else self._how(dead)
        with self.lock:
            if how is not None:
                self._start_failures += 1
                if self._start_failures >= _START_FAILURES:
                    self._break(f"{_START_FAILURES} in a row ended before they were ready "
                                f"(the last, worker process {dead.pid}, {how}: see its stderr)")
            broken = self.broken
        if not broken:
            self.start(dead.index, dead=dead)

    def start(self, index, first=False, dead=None):
        """Starts the worker of slot `index`: a new pool's (`first`: a failure
        is raised) or `dead`'s (a failure breaks the pool for a while; none
        once the slot holds another), whole on the spawning thread
        (docs/pool.md, "A start runs whole on the spawning thread")."""
        spawner.run(self._start_here, index, first, dead)

    def _start_here(self, index, first, dead=None):
        pool = self._pool()
        with self.lock:
            if pool._closed:
                return  # close() began: it stops the workers it knows
            if dead is not None and self.workers[index] is not dead:
                return  # a revival replaced it already (_revive_here)
            self._starting = True
        try:
            with spawner.descriptors:  # a fork waits until the pool has the worker
                try:
                    fresh = WorkerProcess(pool, index, _read)
                except BaseException as exc:
                    if first:
                        raise
                    with self.lock:
                        self._break(f"a worker could not be started "
                                    f"({type(exc).__name__}: {exc})")
                    return
                with self.lock:
                    if first:
                        self.workers.append(fresh)
                    else:
                        self.workers[index] = fresh
                    closed = pool._closed
            if not first:  # (before the attach: a call it serves sees it counted)
                pool._counters.add(workers_replaced=1)
            try:
                if not closed:
                    self.attach(fresh)
            finally:
                # Only now, so that a worker that died at once is detached by
                # its lost (docs/pool.md, "A worker's reader starts after its attach").
                self._watch(fresh, first)
            if closed:
                self._stop([fresh])
        finally:
            with self._attached:
                self._starting = False  # close() waits for this
                self._attached.notify_all()

    def _watch(self, worker, first):
        """Starts `worker`'s reader.  Without one nothing would see the
        worker end: it is ended here as its death would be, and the start
        fails (a new pool's) or breaks the pool for a while."""
        try:
            worker.reader.start()
        except BaseException as exc:
            worker.kill_and_reap()
            with self.lock:
                worker.alive = False
            why = f"a worker's reader thread could not be started ({type(exc).__name__}: {exc})"
            self._detach(worker, WorkerError(f"pyfunc_bridge: {self._pool().name}: {why}"))
            close_fd(worker, "trace_fd")  # (as lost() would: nobody reads its stack)
            worker.ended()
            if first:
                raise
            with self.lock:
                self._break(why)

    def _break(self, why):
        """Marks the pool broken (the lock is held): a call that finds
        no worker attached fails, saying `why`, until the first call after the
        back-off (doubled each time, to _RETRY_MAX_SECONDS) starts the lost
        workers again (revive); workers still alive go on serving.  Callers
        that wait for a worker (ring_call) wake to see it."""
        delay = self.retry_seconds if self._retry_delay is None else min(
            2 * self._retry_delay, _RETRY_MAX_SECONDS)
        self._retry_delay = delay
        self.retry_at = time.monotonic() + delay
        self.broken = (f"pyfunc_bridge: {self._pool().name} cannot start worker processes: "
                       f"{why}. Calls that find no worker ready fail until then: the pool "
                       f"tries again on the first call {delay:g} s after this")
        with self._attached:
            self._attached.notify_all()

    def revive(self):
        """A broken pool past its back-off starts the workers it lost (the
        caller's call then goes to one of them).  The spawning thread does it
        all, as one start: an interrupted caller leaves the pool either
        broken (the next call revives it) or with every worker started."""
        if self._may_revive():  # (checked here first: a call in the back-off does not wait)
            spawner.run(self._revive_here)

    def _may_revive(self):
        # (Broken first: the check of every call on a pool that is not.)
        return (self.broken and not self._pool()._closed
                and time.monotonic() >= self.retry_at)

    def _revive_here(self):
        with self.lock:
            if not self._may_revive():
                return
            self.broken = None
            self._start_failures = 0
            # A dead worker not yet detached (its lost reaps it, up to 5 s)
            # still holds its slot in the dispatcher: its replace starts it.
            dead = [w for w in self.workers if not w.alive and w.generation is None]
        for worker in dead:
            self._start_here(worker.index, False, worker)

    # -------------------------------------------------------------- close --

    def close(self, workers):
        """Ends `workers` (the pool's, as close() began; the pool is closed):
        callers waiting for a worker see the close, a start under way ends
        first, and the native calls each held fail as on a closed pool."""
        with self._attached:
            self._attached.notify_all()
            # A worker's start under way uses the pool's descriptors: it ends
            # first (and stops its worker itself, the pool being closed).  On
            # the spawning thread (a finalizer run there), it is this thread's.
            while self._starting and not spawner.on_thread():
                self._attached.wait()
        self._stop(workers)
        for w in workers:
            self._detach(w, self._pool()._closed_error(w))

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
            except subprocess.TimeoutExpired:  # still in a function (or its wait lock is stuck)
                w.kill_and_reap()
        for w in workers:
            if w.reader.ident is not None and w.reader is not threading.current_thread():
                w.reader.join(timeout=5)  # (one that never started: _watch)
            w.ended()


def _read(pool_ref, worker):
    """The reader thread of one worker's socket: it answers the worker's
    pulls and notes its answers too large for its arena; at the end of
    the stream, the worker is dead (lost).  It holds the pool only
    while it handles a read: a pool dropped without close() is
    collected, and __del__ closes it (its stream then ends)."""
    frames = FrameReader(worker.sock)
    unreadable = None
    try:
        # No local keeps a message while the next is awaited (a large
        # pickled result would stay alive until then).
        while True:
            received = frames.read()
            pool = pool_ref()
            if pool is None or not pool._supervisor._receive(worker, received):
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
        pool._supervisor.lost(worker, unreadable)
