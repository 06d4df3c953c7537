"""Process workers: faults. A killed worker fails its call and is
replaced; a stuck one holds no quick call; a failed start leaves nothing
behind and backs off; a function that exits its process fails its call."""
import gc
import inspect
import os
import re
import signal
import threading
import time

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
from pool_checks import worker_alive
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import process_pool as _process, worker_process
from pyfunc_bridge.pool.supervision import Supervisor
from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.worker import start_worker
from process_pool_helpers import call_in_thread, marked_pid, open_sockets, run_script
from process_pool_helpers import failing_start, marks  # noqa: F401 (fixtures)


_worker_file = start_worker.__file__


def test_a_killed_worker_fails_its_call_and_the_pool_recovers(marks):
    with pfb.ProcessPool(2, name="fault pool") as faulty:
        thread, box = call_in_thread(pf.hang, 30.0, faulty)
        # Killed once the call runs (one it had not started would run in the
        # other worker: tests/pool/test_pool_resend.py).
        victim = marked_pid(marks)
        os.kill(victim, signal.SIGKILL)
        thread.join(timeout=20)
        assert not thread.is_alive()
        message = str(box["error"])
        assert isinstance(box["error"], tf.errors.UnknownError)
        assert "'fault pool'" in message or "fault pool" in message
        assert "killed by signal 9 (SIGKILL)" in message and str(victim) in message
        wait_for(lambda: len(faulty.pids()) == 2)
        assert victim not in faulty.pids()
        for _ in range(4):  # every worker serves again
            assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                          executor=faulty)) in faulty.pids()


def test_quick_calls_never_wait_behind_a_stuck_worker(marks):
    """With one of two workers stuck in a function, many quick calls at once
    all run in the free one: none is queued behind the stuck call."""
    with pfb.ProcessPool(2, name="stuck pool") as stuck:
        hung, hung_box = call_in_thread(pf.hang, 120.0, stuck)
        stuck_pid = marked_pid(marks)
        free_pid = next(p for p in stuck.pids() if p != stuck_pid)
        box = {}

        def quick_calls():
            dataset = tf.data.Dataset.range(64).map(
                lambda i: pfb.numpy_function(pf.pid, [i], tf.int64, executor=stuck),
                num_parallel_calls=8)
            box["pids"] = [int(v) for v in dataset]
        quick = threading.Thread(target=quick_calls)
        quick.start()
        quick.join(timeout=60)  # behind the stuck call, they would wait 120 s
        assert not quick.is_alive()
        assert box["pids"] == [free_pid] * 64
    hung.join(timeout=30)
    assert isinstance(hung_box["error"], tf.errors.FailedPreconditionError)
    # (The words fit a call still queued on that worker's ring too.)
    assert "stuck pool" in str(hung_box["error"]) and "closed" in str(hung_box["error"])
    assert f"worker process {stuck_pid} held the call" in str(hung_box["error"])


@pytest.mark.parametrize("timeout", [None, 30])
def test_a_worker_whose_hello_fails_leaves_no_process_and_no_descriptor(monkeypatch,
                                                                         timeout):
    started = []
    popen = spawner.popen

    def recording_popen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    def failing_send(sock, data):  # worker_process sends the hello, and only it
        raise OSError("the hello could not be sent")
    monkeypatch.setattr(spawner, "popen", recording_popen)
    monkeypatch.setattr(worker_process, "send", failing_send)
    sockets = open_sockets()
    try:
        with pytest.raises(OSError, match="the hello could not be sent") as info:
            pfb.ProcessPool(1, name="hello pool", timeout=timeout)
        # (`info` holds the traceback, and with it the frames of the failed start.)
        assert info.value is not None and len(started) == 1
        assert started[0].poll() is not None  # ended and reaped
        assert not worker_alive(started[0].pid)
        assert open_sockets() <= sockets  # (one of an earlier test may have closed since)
    finally:
        for proc in started:  # what the failed start left (the failure this tests)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_a_pool_whose_workers_cannot_start_says_why_and_tries_again_later(tmp_path,
                                                                           monkeypatch):
    """Workers that die before they are ready break the pool, for a while:
    calls fail at once saying why, and a call after the back-off starts
    workers again."""
    failing = tmp_path / "fails_at_start.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(Supervisor, "retry_seconds", 1.0)  # the back-off this test waits out
    start_worker.pool_module()  # loaded by its real path, before the patch
    monkeypatch.setattr(start_worker, "__file__", str(failing))

    def call():
        return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=broken))
    def refused():
        """The message of a call that fails while the pool is broken (a call
        waits while workers start), and the time by which its back-off ends."""
        with pytest.raises(tf.errors.UnknownError) as info:
            call()
        message = info.value.message
        delay = re.search(r"tries again on the first call (\d+) s after this", message)
        assert delay, message
        return message, time.monotonic() + int(delay.group(1))
    with pfb.ProcessPool(1, name="broken pool") as broken:
        message, retry = refused()
        assert "broken pool cannot start worker processes: 3 in a row ended before " \
               "they were ready" in message
        assert "exited with status 3" in message and "see its stderr" in message
        assert "tries again on the first call 1 s after" in message
        # After the back-off a call starts workers again; they fail again,
        # and the pool waits twice as long.
        wait_for(lambda: time.monotonic() >= retry, seconds=10)
        with pytest.raises(tf.errors.UnknownError, match="exited with status 3"):
            call()
        message, retry = refused()
        assert "tries again on the first call 2 s after" in message
        monkeypatch.setattr(start_worker, "__file__", _worker_file)  # they can start
        wait_for(lambda: time.monotonic() >= retry, seconds=10)
        pid = call()
        assert broken.pids() == [pid] and call() == pid  # no longer broken


def test_a_broken_pool_s_live_workers_go_on_serving(tmp_path, monkeypatch):
    """Workers of one slot that keep dying as they start break the pool, but
    a worker still alive serves every call, eager and in a graph; after the
    back-off a call starts the lost slot again."""
    failing = tmp_path / "fails_at_start.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(Supervisor, "retry_seconds", 1.0)  # the back-off this test waits out
    start_worker.pool_module()  # loaded by its real path, before the patch
    with pfb.ProcessPool(2, name="half broken pool") as half:
        def call():
            return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=half))

        @tf.function
        def graph_call():
            return pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=half)
        live, victim = half.pids()
        monkeypatch.setattr(start_worker, "__file__", str(failing))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: half._supervisor.broken, 60)  # three replacements exited
        monkeypatch.setattr(start_worker, "__file__", _worker_file)  # they can start
        retry = time.monotonic() + 1.0
        assert half.pids() == [live]
        assert [call() for _ in range(3)] == [live] * 3
        assert int(graph_call()) == live
        # Past the back-off, a call starts the lost slot's worker again.
        wait_for(lambda: time.monotonic() >= retry, seconds=10)
        assert call() == live
        wait_for(lambda: len(half.pids()) == 2)
        assert live in half.pids() and victim not in half.pids()


def test_a_function_that_exits_its_process_fails_with_the_status():
    with pfb.ProcessPool(1, name="exit pool") as exiting:
        with pytest.raises(tf.errors.UnknownError, match="exited with status 3"):
            pfb.numpy_function(pf.exits, [tf.constant(3)], tf.int64, executor=exiting)
        assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                      executor=exiting)) in exiting.pids()


def test_a_call_that_fails_in_the_pool_leaves_no_reference_cycle():
    """The pool's error (a worker that died, a pool closed) must not sit in a
    cycle with the frame that raised it: the cycle kept the pool and every
    caller's frame, with the results they held (their workers' shared
    memory), until the next garbage collection."""
    def run_frames():  # frames of the pool's code (ring_call's, above all)
        pool_code = os.path.dirname(_process.__file__)
        return [o for o in gc.garbage if inspect.isframe(o)
                and os.path.dirname(o.f_code.co_filename) == pool_code]

    with pfb.ProcessPool(1, name="cycle pool") as cycling:
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):  # (the bridge keeps a thread's last error a while)
                with pytest.raises(tf.errors.UnknownError, match="exited with status 3"):
                    pfb.numpy_function(pf.exits, [tf.constant(3)], tf.int64,
                                       executor=cycling)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            found = run_frames()
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert found == []


# A replacement worker that dies at once, whose death is handled while its
# start is still under way: between the pool's two steps of that death (the
# dispatcher's, then the worker's descriptors), the start attaches the worker
# to the dispatcher.  The threads are held there by tracing (the one way to
# order them); the next worker then serves the pool's calls.
_DIES_AT_ONCE_SCRIPT = "pool/faults_dies_at_once.py"


def test_a_replacement_that_dies_as_it_starts_leaves_a_pool_that_serves(failing_start):
    run_script(_DIES_AT_ONCE_SCRIPT, failing_start)


# A replacement worker that exited before its hello was sent: the broken pipe
# is its death, counted as a start that ended before it was ready, and the
# next worker serves (it broke the pool for its back-off).
_DIES_BEFORE_HELLO_SCRIPT = "pool/faults_dies_before_hello.py"


def test_a_replacement_that_exits_before_its_hello_is_replaced(failing_start):
    run_script(_DIES_BEFORE_HELLO_SCRIPT, failing_start)


_UNWATCHED_SCRIPT = "pool/faults_unwatched.py"


def test_a_worker_whose_reader_cannot_start_is_ended_and_the_pool_breaks():
    # Nothing would see such a worker die: its calls would wait for ever.
    run_script(_UNWATCHED_SCRIPT)


# A broken pool revived while one of its dead workers is still being handled
# (its lost reaps it, for up to 5 s): held `before` the dead worker's slot is
# detached, or `after`.  The revival and the dead worker's own replacement
# start one worker for its slot between them, and the pool knows every worker.
_REVIVAL_DURING_A_DEATH_SCRIPT = "pool/faults_revival_during_a_death.py"


@pytest.mark.parametrize("window", ["before", "after"])
def test_a_revival_while_a_dead_worker_is_handled_starts_one_worker_per_slot(
        failing_start, window):
    run_script(_REVIVAL_DURING_A_DEATH_SCRIPT, failing_start, window)
