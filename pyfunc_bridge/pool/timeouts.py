"""The end of a call that may not run on: past the pool's per-call timeout
(the watchdog that ends its worker, and the error that call then fails
with), or abandoned by its caller (Ctrl-C)."""
import os
import signal
import threading
import time
import weakref

from pyfunc_bridge.pool.errors import CallTimeoutError
from pyfunc_bridge.worker import start_worker

_STACK_GRACE_SECONDS = 1.0   # for a timed-out worker to write its stack, then SIGKILL
# What a worker's loading of a function (its unpickling and the imports that
# brings, at the function's first call there) may take beyond the timeout:
# slow imports (TensorFlow's take seconds) must not fail every first call,
# and a hung one must not hold its worker for ever.
LOAD_GRACE_SECONDS = 60.0
# The worker's own modules, whose frames a stack leaves out.
_WORKER_DIR = os.path.dirname(start_worker.__file__)


def abandoned(pool, slot, call_id):
    """The fate of a call its caller stopped waiting for (a Ctrl-C, Route.call's
    `wait`) after it was posted to worker `slot`, as a timed-out call's: its
    worker, if it runs it, is ended (SIGKILL: nobody reads a stack) and
    replaced (Supervisor.lost), so that the pool serves the next call now,
    not once the function returns.  A worker that has not started the call,
    or is past it, runs on (it hands the results back)."""
    with pool._lock:  # (a worker marked alive has not been reaped: its pid is its own)
        worker = pool._supervisor.workers[slot]  # (a slot calls went to: started)
        if worker.alive and worker.channel is not None and worker.channel.running()[0] == call_id:
            os.kill(worker.pid, signal.SIGKILL)


def _stopped(pid):
    """Whether process `pid` is stopped (its state in /proc: T, or t when traced)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class Deadlines:
    """A pool's per-call timeout.  A watchdog thread reads the call each
    worker runs and since when (its control segment's running call,
    shm_layout.h: CLOCK_MONOTONIC, the same clock in every process).  A
    worker past its deadline gets SIGUSR1, on which ``faulthandler`` writes
    its Python stack to its trace file and lets the signal end it
    (start_worker.py); SIGKILL follows after _STACK_GRACE_SECONDS.  Its death
    (Supervisor.lost) fails that call with CallTimeoutError and the stack; the
    dispatcher resends the calls it had not started.  A worker that leaves
    its requests unread for the timeout between calls (stopped, or stuck
    outside any call) is ended too, and its calls run in another (_serving)."""

    def __init__(self, pool, timeout):
        self.timeout_ns = int(timeout * 1e9)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, args=(weakref.ref(pool),),
                                       daemon=True, name=f"{pool.name} watchdog")

    @staticmethod
    def prepare(hello, name):
        """Before a worker of pool `name` starts: the hello names its trace
        file (a memfd this process reads), which is returned, and the load's
        grace."""
        trace_fd = os.memfd_create(f"{name}-stack", os.MFD_CLOEXEC)
        hello["deadlines"] = {"trace_fd": trace_fd,
                              "load_grace_ns": int(LOAD_GRACE_SECONDS * 1e9)}
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
            for worker in pool._supervisor.workers:
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
                    wait = min(wait, self._serving(worker, now))
                    continue
                worker.unread = None
                if now - start >= self.timeout_ns:
                    worker.timed_out = running
                    worker.kill_at = now + int(_STACK_GRACE_SECONDS * 1e9)
                    os.kill(worker.pid, signal.SIGUSR1)
                    wait = min(wait, worker.kill_at - now)
                else:
                    wait = min(wait, start + self.timeout_ns - now)
        return max(wait, 0) / 1e9

    def _serving(self, worker, now):
        """Between calls: a worker that leaves its requests unread is ended
        (SIGKILL: it runs no call whose stack would tell why), and the calls
        it had not started run in another worker: after the timeout when it
        is stopped (SIGSTOP, a debugger), else after the load's grace too,
        since work outside a call (a large function pulled over the socket,
        a released result's finalizer) may take long.  Returns the ns until
        that could be."""
        # (A worker busy with a batch it read starts calls meanwhile: serving.)
        seen = worker.channel.unread()
        if seen is None or worker.unread is None or worker.unread[0] != seen:
            worker.unread = None if seen is None else (seen, now)
            return self.timeout_ns
        limit = self.timeout_ns + (0 if _stopped(worker.pid) else int(LOAD_GRACE_SECONDS * 1e9))
        if now - worker.unread[1] >= limit:
            os.kill(worker.pid, signal.SIGKILL)  # (again, until it is reaped: harmless)
            return self.timeout_ns
        return worker.unread[1] + limit - now

    def error(self, pool, worker):
        """The exception of the call `worker` was told off for (the one it
        had started when it ended: the dispatcher resends the others)."""
        stack = self.stack(worker)
        pool._counters.add(timeouts=1)
        return CallTimeoutError(
            f"pyfunc_bridge: the call ran past the {pool.timeout:g} s timeout of {pool.name} "
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
                 if not (line.lstrip().startswith("File ") and _WORKER_DIR in line)]
        if not any(line.lstrip().startswith("File ") for line in lines):
            return (f"(none: the worker wrote no stack within {_STACK_GRACE_SECONDS:g} s of "
                    f"SIGUSR1 and was killed; a function that handles SIGUSR1 hides it)")
        return "\n".join(lines).strip()

    def close(self):
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
