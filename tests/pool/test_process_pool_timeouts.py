"""Process workers: a pool's timeout. A call past it fails with the
function's stack, its worker is replaced, and calls the worker had not
started run in another; the timeout argument is checked."""
import gc
import inspect
import os
import re
import signal
import threading

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
from pool_checks import worker_alive
from pyfunc_bridge.pool import timeouts
import pyfunc_bridge as pfb
from process_pool_helpers import call_in_thread


def _lines_of(func, texts):
    """The line numbers of the lines of `func` that contain one of `texts`."""
    lines, first = inspect.getsourcelines(func)
    return {first + i for i, line in enumerate(lines) if any(t in line for t in texts)}


def _assert_timed_out(error, func, texts, pool):
    """`error` is the timeout of a call of `func`, stuck on a line holding one of `texts`."""
    assert isinstance(error, tf.errors.DeadlineExceededError), repr(error)
    message = error.message
    assert f"ran past the {pool.timeout:g} s timeout of {pool.name}" in message, message
    where = re.search(rf'process_functions.py", line (\d+) in {func.__name__}\n', message)
    assert where and int(where[1]) in _lines_of(func, texts), message
    killed = int(message.split("in worker process ")[1].split(",")[0])
    wait_for(lambda: not worker_alive(killed))
    return killed


@pytest.mark.parametrize("func, texts", [(pf.hang, ["time.sleep"]),
                                         (pf.spin, ["while time", "n += 1"])])
def test_a_call_past_its_timeout_fails_with_the_stack_and_later_calls_run(func, texts):
    """Eagerly, in a tf.function and in a tf.data map: DeadlineExceededError
    with the function's stack (a sleeping one, and one holding its GIL); the
    worker is ended and replaced."""
    with pfb.ProcessPool(2, timeout=1.5, name="timeout pool") as pool:
        runs = {
            "eager": lambda: pfb.numpy_function(func, [tf.constant(60.0)], tf.int64,
                                                executor=pool),
            "graph": lambda: tf.function(lambda x: pfb.numpy_function(
                func, [x], tf.int64, executor=pool))(tf.constant(60.0)),
            "tf.data": lambda: list(tf.data.Dataset.from_tensors(60.0).map(
                lambda x: pfb.numpy_function(func, [x], tf.int64, executor=pool))),
        }
        killed = set()
        for how, run in runs.items():
            with pytest.raises(tf.errors.DeadlineExceededError) as info:
                run()
            killed.add(_assert_timed_out(info.value, func, texts, pool))
            # Later calls run (a quick one is never timed out).
            for _ in range(3):
                got = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                             executor=pool))
                assert got in pool.pids() and got not in killed, how
        assert len(killed) == 3
    assert not _watchdogs(pool)  # close() ends the watchdog


def _watchdogs(pool):
    """The live threads that watch `pool`'s deadlines (by their name)."""
    return [t for t in threading.enumerate() if t.name == f"{pool.name} watchdog"]


def test_calls_a_timed_out_worker_had_not_started_run_in_another(tmp_path):
    """A worker ended for a timeout held calls it had not started (the batch
    it took from the queue): they never ran, so they run in another worker
    rather than fail."""
    go = tmp_path / "go"
    # Time enough for the first call to wait while this test queues four more.
    with pfb.ProcessPool(1, timeout=5, name="requeue pool") as pool:
        # Each call's input is placed in the arena when it is submitted: the
        # calls wait, in order, behind the first.
        def submitted(call, arg):
            free = pool.free_input_bytes
            made = call_in_thread(call, arg, pool)
            wait_for(lambda: pool.free_input_bytes < free)
            return made
        first, first_box = submitted(pf.wait_for_file, str(go))
        hung, hung_box = submitted(pf.hang, 60.0)
        quick = [submitted(pf.pid, 0) for _ in range(3)]
        go.touch()  # the worker answers, then takes the hung call and the quick ones
        for thread, _ in [(first, None), (hung, None)] + quick:
            thread.join(timeout=60)
            assert not thread.is_alive()
        assert "error" not in first_box, first_box["error"]
        timed_out = int(first_box["result"])
        _assert_timed_out(hung_box["error"], pf.hang, ["time.sleep"], pool)
        for _, box in quick:
            assert "error" not in box, box["error"].message
            assert int(box["result"]) == pool.pids()[0] != timed_out


def test_a_worker_that_outlives_its_timeout_signal_runs_later_calls_to_their_end():
    """A function that handles SIGUSR1 answers the pool's timeout signal
    with its own error instead of ending its worker.  The worker lives on;
    its later calls, well within their deadlines, must not be ended by the
    kill that was meant for the call that answered (it came a grace period
    later, and failed whichever call ran then, as ended for another's
    timeout)."""
    with pfb.ProcessPool(1, timeout=0.5, name="usr1 pool") as pool:
        (pid,) = pool.pids()
        with pytest.raises(tf.errors.UnknownError, match="SIGUSR1 handled by the function"):
            pfb.numpy_function(pf.handles_sigusr1, [tf.constant(5.0)], tf.int64,
                               executor=pool)
        for _ in range(6):  # 1.8 s: past the grace period of the kill
            assert int(pfb.numpy_function(pf.slow_pid, [tf.constant(0.3)], tf.int64,
                                          executor=pool)) == pid

def test_a_worker_that_leaves_its_calls_unread_is_replaced_and_they_run():
    """An idle worker that stops serving (SIGSTOP: it never starts the call
    posted to it, so no call's clock runs) holds that call no longer than
    the timeout: it is ended, and the call (of a function it never loaded)
    runs in its replacement."""
    with pfb.ProcessPool(1, timeout=1, name="stopped pool") as pool:
        (stopped,) = pool.pids()
        pfb.numpy_function(pf.double, [1.0], tf.float64, executor=pool)  # (it serves)
        os.kill(stopped, signal.SIGSTOP)
        try:
            thread, box = call_in_thread(pf.pid, 0, pool)
            thread.join(timeout=60)
            assert not thread.is_alive()
            assert "error" not in box, box["error"]
            assert int(box["result"]) == pool.pids()[0] != stopped
            wait_for(lambda: not worker_alive(stopped))
        finally:
            if worker_alive(stopped):
                os.kill(stopped, signal.SIGKILL)


def test_a_worker_busy_between_calls_is_not_ended_as_stuck(tmp_path, monkeypatch):
    """Work outside any call (here a forgotten function's finalizer, 3 s) is
    not a stall under a 0.5 s timeout: the worker runs on, and the calls
    that waited for it run there."""
    monkeypatch.setenv("PFB_TEST_MARKS", str(tmp_path))  # (the workers inherit it)
    with pfb.ProcessPool(1, timeout=0.5, name="busy pool") as pool:
        (worker,) = pool.pids()
        holder = pf.SlowToFreeInWorker(3.0)
        held = lambda x: x + (0.0 if holder else 1.0)  # noqa: E731 - pickled by value
        pfb.numpy_function(held, [1.0], tf.float64, executor=pool)
        del held, holder
        gc.collect()  # the worker forgets it with the next message, then frees it
        first, first_box = call_in_thread(pf.pid, 0, pool)
        wait_for(lambda: os.listdir(tmp_path) == [str(worker)], 60)  # in the finalizer
        second, second_box = call_in_thread(pf.pid, 0, pool)  # unread for 3 s
        for thread in (first, second):
            thread.join(timeout=60)
            assert not thread.is_alive()
        assert [int(box["result"]) for box in (first_box, second_box)] == [worker] * 2
        assert pool.pids() == [worker]


def test_a_result_whose_release_hangs_times_its_call_out():
    """The call's clock runs until its answer is posted: a result whose
    finalizer hangs as the worker lets go of it times the call out, with
    the finalizer's stack, rather than hold it for ever."""
    with pfb.ProcessPool(1, timeout=1, name="release pool") as pool:
        with pytest.raises(tf.errors.DeadlineExceededError) as info:
            pfb.numpy_function(pf.hangs_when_released, [0.0], tf.float64, executor=pool)
        _assert_timed_out(info.value, pf._HangsWhenReleased.__del__, ["time.sleep"], pool)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "1", True])
def test_timeout_must_be_a_positive_number_of_seconds(timeout):
    with pytest.raises(ValueError, match=f"timeout must be a positive number of seconds, "
                                         f"or None for no limit, got {re.escape(repr(timeout))}"):
        pfb.ProcessPool(1, timeout=timeout)


def test_a_pool_without_a_timeout_writes_no_status():
    with pfb.ProcessPool(1, name="no timeout pool", timeout=None) as pool:
        assert pool.timeout is None and not _watchdogs(pool)
        assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                      executor=pool)) == pool.pids()[0]


def test_a_function_whose_loading_hangs_times_out_with_the_loading_stack(monkeypatch):
    """A function's first call in a worker unpickles it under the timeout
    plus the load's grace: an import that hangs fails that call as a hung
    function would, and the pool goes on."""
    monkeypatch.setattr(timeouts, "LOAD_GRACE_SECONDS", 0.5)
    with pfb.ProcessPool(1, timeout=1.5, name="load timeout pool") as pool:
        with pytest.raises(tf.errors.DeadlineExceededError) as info:
            pfb.numpy_function(pf.LoadedBy(pf.hang_when_loaded), [tf.constant(1.0)], tf.float32,
                               executor=pool)
        killed = _assert_timed_out(info.value, pf.hang_when_loaded, ["time.sleep"], pool)
        got = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))
        assert got in pool.pids() and got != killed


def test_a_function_s_loading_gets_a_grace_beyond_the_timeout_and_its_call_the_whole():
    """A load longer than the timeout (a slow import) and then a call almost
    as long as it: the call succeeds (a worker that timed out would load it
    again, and so fail every call)."""
    with pfb.ProcessPool(1, timeout=2.5, name="slow load pool") as pool:
        for _ in range(2):
            got = pfb.numpy_function(pf.SlowToLoad(2.0), [tf.constant(1.0)], tf.float32,
                                     executor=pool)
            assert float(got) == 1.0
        assert float(pfb.numpy_function(pf.SlowToLoad(3.0, call_seconds=0.1),
                                        [tf.constant(2.0)], tf.float32, executor=pool)) == 2.0
