"""The parent's native side of a pool's rings (src/pool/dispatch_*.c, through
the worker module's Dispatcher, which every ProcessPool with arenas has):
calls posted, served by real pool workers and completed by the dispatcher's
reply threads without Python; LOAD once per worker; input blocks back when
the worker lets go; result blocks handed back; a worker's death fails its
native calls with the pool's message; and, the point of it, calls keep
completing while another thread holds the GIL (issue 19's proof, at the
dispatcher; tests/pool/test_pool_native.py has it at op level)."""
import ctypes
import pickle
import threading
import time

import numpy as np
import pytest

import pyfunc_bridge as pfb
from pyfunc_bridge.pool import pickling as _pickling
from pyfunc_bridge.worker import compiled as _worker

pw = _worker.pool_module()


def double(a):
    return a * 2


def nap(a):
    import time as t
    t.sleep(float(a[0]))
    return a


def die(a):
    import os
    os._exit(3)


def ready(pool, timeout=60):
    """The pool's dispatcher, once every worker serves its ring.  These tests
    drive the dispatcher itself (the Cython module), with the pool as the
    harness that starts and attaches real workers: they read the pool's
    dispatcher and its workers' state, which no public API shows."""
    deadline = time.monotonic() + timeout
    while not all(w.alive and w.ready and w.generation for w in pool._supervisor.workers):
        assert time.monotonic() < deadline, "workers never ready"
        time.sleep(0.01)
    return pool._dispatch


def register(dispatch, token, func):
    dispatch.register(token, pickle.dumps((None, _pickling.dumps(func, 5))))


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def pool():
    with pfb.ProcessPool(2, arena_bytes=16 << 20, name="dispatch-test") as pool:
        yield pool


def test_calls_round_trip_and_blocks_come_back(pool):
    dispatch = ready(pool)
    register(dispatch, 7, double)
    x = np.arange(1 << 14, dtype=np.float64)  # 128 KiB: a fresh result in the arena
    offsets = set()
    for _ in range(20):
        reply, worker = dispatch.route(7, 0).call([x])
        message = reply.message
        assert message.kind == pw.MSG_DONE and message.status == pw.STATUS_OK
        [(code, bits, _, flags, offset, size, shape)] = message.items
        assert (code, bits, shape) == (2, 64, x.shape) and flags & pw.TENSOR_SHARED
        result = np.frombuffer(reply.read(offset, size), np.float64)  # the block goes back
        np.testing.assert_array_equal(result, x * 2)
        offsets.add((worker, offset))
    # Handed back, each block serves the next call (first fit): one per worker at most.
    assert len(offsets) <= 2
    counts = dispatch.counts()
    assert counts["calls"] == 20 and 1 <= counts["loads"] <= 2
    wait_for(lambda: dispatch.counts()["input_blocks"] == 0)  # INPUTS_BACK freed them


def test_a_waiting_caller_reads_its_own_done(pool):
    """The worker's DONE wakes the caller waiting for it, which reads it
    itself (its worker's reader role), instead of waking the reply thread,
    which would then wake the caller: one wake-up per call less.  The reply
    threads sleep through such calls."""
    dispatch = ready(pool)
    register(dispatch, 11, double)
    dispatch.route(11, 0).call_many([np.ones(1)], 5)  # loaded on the worker(s) it goes to
    before = dispatch.counts()
    assert all(dispatch.route(11, 0).call_many([np.ones(1)], 200))
    after = dispatch.counts()
    assert after["caller_reads"] - before["caller_reads"] >= 100
    assert after["reply_sleeps"] - before["reply_sleeps"] < 100
    wait_for(lambda: dispatch.counts()["input_blocks"] == 0)  # INPUTS_BACK read too


def test_unknown_tokens_and_bad_inputs_are_refused(pool):
    dispatch = ready(pool)
    with pytest.raises(pw.Declined, match="declined the call"):
        dispatch.route(99, 0).call([np.ones(2)])
    with pytest.raises(pw.Declined, match="neither numbers nor bytes"):
        dispatch.route(99, 0).call([np.array([1.5], dtype=object)])
    register(dispatch, 8, double)
    with pytest.raises(OSError):  # E2BIG: can never fit the 16 MiB arena
        dispatch.route(8, 0).call([np.ones(3 << 20)])


def test_concurrent_callers_use_both_workers(pool):
    dispatch = ready(pool)
    register(dispatch, 9, nap)
    slots = set()  # the worker slots whose arenas answered
    errors = []

    def caller(i):
        try:
            for _ in range(3):
                _, worker = dispatch.route(9, 0).call([np.array([0.2, i])])
                slots.add(worker)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert slots == {0, 1} and dispatch.counts()["loads"] == 2


def test_a_dead_worker_fails_its_native_call_and_its_replacement_serves(pool):
    dispatch = ready(pool)
    register(dispatch, 10, die)
    register(dispatch, 11, double)
    with pytest.raises(pw.DispatchFailed) as failed:
        dispatch.route(10, 0).call([np.ones(2)])
    code, message = failed.value.args
    assert code == 2 and "WorkerError" in message and "exited with status 3" in message
    ready(pool)  # the replacement serves
    reply, _ = dispatch.route(11, 0).call([np.ones(2)])
    assert reply.message.status == pw.STATUS_OK


def test_native_calls_keep_completing_while_a_thread_holds_the_gil(pool):
    """One thread holds the GIL for a second inside a C call (usleep through
    ctypes.PyDLL, which keeps the GIL); calls dispatched by another thread's
    C loop keep completing meanwhile (each one a submit, a worker's reply, a
    reply thread's wake-up of the caller): the workers' end stamps fall
    inside the second."""
    dispatch = ready(pool)
    register(dispatch, 12, double)
    dispatch.route(12, 0).call_many([np.ones(16)], 5)  # both loaded, warm
    libc = ctypes.PyDLL(None)
    stamps = []
    looping = threading.Thread(target=lambda: stamps.extend(
        dispatch.route(12, 0).call_many([np.ones(16)], 3000)))
    looping.start()
    try:
        wait_for(lambda: dispatch.counts()["calls"] > 100)
        held_from = time.time_ns()
        libc.usleep(1_000_000)  # holds the GIL: no Python thread runs
        held_to = time.time_ns()
    finally:
        looping.join(timeout=120)
    assert not looping.is_alive() and None not in stamps
    during = sum(1 for _, ended in stamps if held_from < ended < held_to)
    assert during >= 50, (during, len(stamps))
    print(f"{during} of {len(stamps)} native calls ended while the GIL was held for 1 s")
