"""The dispatcher's one scheduler (src/pool/dispatch_queue.c, issue 28): a worker
has at most two calls posted and unanswered (its credits), and a worker held
by a long call takes no more; the other calls wait in the pool queue, their
inputs already in the input arena, and go to the worker that comes free.
So a worker stuck in a slow call holds only the calls it already had, as
the pool's Python path guaranteed.  Every path meets a queued call: its
caller abandons it (its blocks come back at once), the dispatcher closes
(it fails), a worker dies (the queue waits for the replacement).

Through the worker module's Dispatcher (as tests/pool/test_pool_dispatch.py),
with a function held at a gate the test opens (a file), never a sleep."""
import errno
import os
import signal
import threading

import numpy as np
import pytest

import pyfunc_bridge as pfb
from pyfunc_bridge.worker import compiled as _worker
from conftest import wait_for
from test_pool_dispatch import ready, register

pw = _worker.pool_module()
TOKEN = 40
CREDITS = 2  # src/pool/dispatch_queue.c


def gated(directory):
    """Input k >= 0: writes started-k (its pid), then waits for go-k; k < 0
    returns at once.  Returns the worker's pid."""
    def run(a):
        import os as _os
        import time as _time
        import numpy as _np
        k = int(a[0])
        if k >= 0:
            tmp = _os.path.join(directory, f".started-{k}")
            with open(tmp, "w") as f:
                f.write(str(_os.getpid()))
            _os.rename(tmp, _os.path.join(directory, f"started-{k}"))
            while not _os.path.exists(_os.path.join(directory, f"go-{k}")):
                _time.sleep(0.002)
        return _np.array([_os.getpid()], _np.int64)
    return run


class Gates:
    def __init__(self, directory):
        self.dir = directory

    def started(self, k):
        """Waits until call k runs; its worker's pid."""
        path = self.dir / f"started-{k}"
        wait_for(path.exists, seconds=60)
        return int(path.read_text())

    def open(self, *keys):
        for k in keys:
            (self.dir / f"go-{k}").touch()


class Calls:
    """Threads that call the gated function; `done`: the pid of each call
    answered, `errors`: what the others raised."""

    def __init__(self, dispatch):
        # (A route of its own: it keeps the dispatcher's memory, not the
        # dispatcher open.)
        self.route, self.done, self.errors, self.threads = dispatch.route(TOKEN, 0), [], [], []

    def start(self, key, threads=1, times=1):
        def run():
            try:
                for _ in range(times):
                    reply, _ = self.route.call([np.array([key], np.float64)])
                    [(_, _, _, _, offset, size, _)] = reply.message.items
                    self.done.append(int(np.frombuffer(reply.read(offset, size), np.int64)[0]))
            except BaseException as exc:  # noqa: BLE001 - the test reads them
                self.errors.append(exc)
        for _ in range(threads):
            self.threads.append(threading.Thread(target=run, daemon=True))
            self.threads[-1].start()

    def join(self):
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads)


@pytest.fixture
def gates(tmp_path):
    gates = Gates(tmp_path)
    yield gates
    gates.open(*range(8))  # whatever the test left held


def _pool(workers, name):
    return pfb.ProcessPool(workers, arena_bytes=16 << 20, name=name)


def test_a_stuck_worker_holds_only_its_calls_while_the_other_serves_the_rest(gates):
    with _pool(2, "queue one stuck") as pool:
        dispatch = ready(pool)
        register(dispatch, TOKEN, gated(str(gates.dir)))
        stuck, fast = Calls(dispatch), Calls(dispatch)
        stuck.start(0)
        held = gates.started(0)
        fast.start(-1, threads=20)
        # All of them answered by the other worker while the stuck one
        # holds its call, and one more at most (its next, posted before
        # the first had run long).
        wait_for(lambda: len(fast.done) >= 20 - (CREDITS - 1), seconds=60)
        assert held not in fast.done and not fast.errors
        gates.open(0)
        stuck.join()
        fast.join()
        assert len(fast.done) == 20 and fast.done.count(held) <= CREDITS - 1
        assert stuck.done == [held] and dispatch.counts()["queued"] == 0


def test_queued_calls_go_to_the_worker_that_comes_free_not_behind_a_stuck_one(gates):
    """Both workers stuck: the calls wait in the pool queue (beyond one
    more each), and all go to the worker released first, none behind the
    other.  Posted at once to the fewest in flight, half would wait behind
    the call that stays stuck."""
    n = 8
    with _pool(2, "queue both stuck") as pool:
        dispatch = ready(pool)
        register(dispatch, TOKEN, gated(str(gates.dir)))
        stuck, fast = Calls(dispatch), Calls(dispatch)
        stuck.start(0)
        first = gates.started(0)
        stuck.start(1)
        second = gates.started(1)
        assert first != second
        fast.start(-1, threads=n)
        wait_for(lambda: dispatch.counts()["queued"] >= n - 2 * (CREDITS - 1), seconds=60)
        assert not fast.done
        gates.open(1)
        wait_for(lambda: len(fast.done) >= n - (CREDITS - 1), seconds=60)
        assert set(fast.done) == {second} and dispatch.counts()["queued"] == 0
        gates.open(0)
        stuck.join()
        fast.join()
        assert len(fast.done) == n and fast.done.count(first) <= CREDITS - 1
        assert not stuck.errors and not fast.errors


def test_an_abandoned_queued_call_gives_its_input_blocks_back_at_once(gates):
    with _pool(1, "queue abandon") as pool:
        dispatch = ready(pool)
        register(dispatch, TOKEN, gated(str(gates.dir)))
        full = dispatch.free_bytes()
        stuck = Calls(dispatch)
        stuck.start(0)
        gates.started(0)
        big = np.full(1 << 17, -1.0)  # 1 MiB
        for _ in range(5):
            with pytest.raises(TimeoutError, match="abandoned"):
                dispatch.route(TOKEN, 0).call([big], wait=0)
        assert dispatch.counts()["queued"] == 0
        # The worker's own until it runs: its stuck call's block and at most
        # one of these (posted as its next call); the others came back.
        wait_for(lambda: full - dispatch.free_bytes() <= (CREDITS - 1) * (1 << 20) + (64 << 10))
        gates.open(0)
        stuck.join()
        assert not stuck.errors
        # The posted one, abandoned, runs; its blocks come back after it.
        wait_for(lambda: dispatch.free_bytes() == full
                 and dispatch.counts()["input_blocks"] == 0, seconds=30)


def test_closing_the_dispatcher_fails_its_queued_calls(gates):
    with _pool(1, "queue close") as pool:
        dispatch = ready(pool)
        register(dispatch, TOKEN, gated(str(gates.dir)))
        stuck, waiting = Calls(dispatch), Calls(dispatch)
        stuck.start(0)
        gates.started(0)
        waiting.start(-1, threads=3)
        wait_for(lambda: dispatch.counts()["queued"] >= 3 - (CREDITS - 1), seconds=60)
        later = dispatch.route(TOKEN, 0)
        # Closed as a pool closes it: its last reference goes (its dealloc);
        # the routes keep its memory, not its service.
        pool._dispatch = dispatch = None
        waiting.join()
        stuck.join()
        for failed in waiting.errors + stuck.errors:
            assert isinstance(failed, pw.DispatchFailed)
            # FAILED_PRECONDITION, as PoolClosedError's everywhere else.
            assert failed.args == (9, "pyfunc_bridge: the pool was closed")
        assert len(waiting.errors) == 3 and len(stuck.errors) == 1
        with pytest.raises(pw.Declined, match="declined the call") as refused:
            later.call([np.ones(1)])
        assert refused.value.errno == errno.EPIPE


def test_queued_calls_wait_for_a_dead_worker_s_replacement(gates):
    """One worker stuck, the other killed while stuck: the queue keeps its
    calls (a worker is still attached), and the replacement takes them as
    soon as it is attached; the dead worker's unstarted call is sent
    anew."""
    n = 6
    with _pool(2, "queue replacement") as pool:
        dispatch = ready(pool)
        register(dispatch, TOKEN, gated(str(gates.dir)))
        stuck, fast = Calls(dispatch), Calls(dispatch)
        stuck.start(0)
        held = gates.started(0)
        stuck.start(1)
        killed = gates.started(1)
        fast.start(-1, threads=n)
        wait_for(lambda: dispatch.counts()["queued"] >= n - 2 * (CREDITS - 1), seconds=60)
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: len(fast.done) >= n - (CREDITS - 1), seconds=60)
        assert not set(fast.done) & {held, killed}
        assert len(set(fast.done)) == 1 and set(fast.done) <= set(pool.pids())
        gates.open(0)
        stuck.join()
        fast.join()
        assert len(fast.done) == n and not fast.errors
        [died] = stuck.errors
        assert isinstance(died, pw.DispatchFailed) and "WorkerError" in died.args[1]
