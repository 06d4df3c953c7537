"""Process workers (executor=): statistics per pool in pfb.stats().pools,
one test per counter."""
import dataclasses
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
import pyfunc_bridge as pfb

pytestmark = pytest.mark.usefixtures("stats_on")


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name="stats pool") as one:
        yield one


def pool_stats(name="stats pool"):
    return pfb.stats().pools[name]


def call(func, inputs, tout, pool, **kwargs):
    return pfb.numpy_function(func, inputs, tout, executor=pool, **kwargs)


def test_calls_count_answered_calls_those_that_raise_included(pool):
    call(pf.double, [tf.constant([1.0])], tf.float32, pool)
    call(pf.double, [tf.constant([2.0])], tf.float32, pool)
    with pytest.raises(tf.errors.InvalidArgumentError):
        call(pf.raises_value_error, [tf.constant(0)], tf.int64, pool)
    assert pool_stats().calls == 3


def test_bytes_in_and_out_count_the_data_both_ways(pool):
    call(pf.add, [tf.zeros([1024], tf.float32), tf.ones([1024], tf.float32)], tf.float32,
         pool)
    s = pool_stats()
    assert (s.bytes_in, s.bytes_out) == (2 * 4096, 4096)


def test_bytes_count_strings_and_scalars_that_travel_pickled(pool):
    words = [b"alpha", b"be", b"c"]
    out = call(pf.upper, [tf.constant(words)], tf.string, pool)
    assert out.numpy().tolist() == [b"ALPHA", b"BE", b"C"]
    call(pf.pid, [tf.constant(0)], tf.int64, pool)  # a 0-d input, an np.int64 result
    s = pool_stats()
    assert s.bytes_in == 8 + 4
    assert s.bytes_out == 8 + 8


def test_copies_saved_counts_results_handed_over_from_shared_memory(pool):
    call(pf.two_results, [tf.zeros([64], tf.int32)], [tf.int32, tf.int32], pool)
    assert pool_stats().copies_saved == 2
    # copy=True copies the result blocks; a pickled result saves nothing.
    call(pf.double, [tf.zeros([64], tf.int32)], tf.int32, pool, copy=True)
    call(pf.pid, [tf.constant(0)], tf.int64, pool)
    assert pool_stats().copies_saved == 2


def test_a_result_larger_than_the_arena_saves_no_copy():
    with pfb.ProcessPool(1, arena_bytes=1 << 12, name="small stats pool") as small:
        call(pf.double, [tf.zeros([4096], tf.float32)], tf.float32, small)
    s = pool_stats("small stats pool")
    assert (s.calls, s.bytes_in, s.bytes_out, s.copies_saved) == (1, 16384, 16384, 0)


def test_time_queued_and_in_workers(pool):
    """One worker, two calls of 0.3 s at once: the second waits for the first."""
    threads = [threading.Thread(target=call, args=(pf.slow_pid, [tf.constant(0.3)],
                                                   tf.int64, pool)) for _ in range(2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - start
    s = pool_stats()
    assert s.calls == 2
    assert 0.6 <= s.seconds_in_workers <= elapsed
    assert 0.25 <= s.seconds_queued <= elapsed


def test_workers_replaced():
    with pfb.ProcessPool(1, name="replacing pool") as one:
        victim = one.pids()[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: one.pids() and one.pids()[0] != victim, 20)
        assert int(call(pf.pid, [tf.constant(0)], tf.int64, one)) == one.pids()[0]
    s = pool_stats("replacing pool")
    assert (s.workers_replaced, s.calls) == (1, 1)


def test_a_replacement_is_counted_before_it_serves(monkeypatch):
    from pyfunc_bridge.pool.supervision import Supervisor
    attach = Supervisor.attach
    served, attached = threading.Event(), []

    def slow_attach(self, worker):  # the replacement serves before its start ends
        attach(self, worker)
        attached.append(worker)
        if len(attached) > 1:
            served.wait(30)

    monkeypatch.setattr(Supervisor, "attach", slow_attach)
    with pfb.ProcessPool(1, name="counted replacement") as one:
        victim = one.pids()[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: one.pids() and one.pids()[0] != victim, 20)
        try:
            call(pf.pid, [tf.constant(0)], tf.int64, one)
            assert pool_stats("counted replacement").workers_replaced == 1
        finally:
            served.set()


@pytest.fixture(scope="module")
def timing_pool():
    """A pool whose calls time out after 0.5 s (pf.hang(60) runs past it)."""
    with pfb.ProcessPool(1, name="timeout stats pool", timeout=0.5) as one:
        yield one


def test_timeouts_count_each_call_past_the_pools_timeout(timing_pool):
    for _ in range(2):
        with pytest.raises(tf.errors.DeadlineExceededError):
            call(pf.hang, [tf.constant(60.0)], tf.int64, timing_pool)
    # (Each replacement counts once its worker started, after the call failed.)
    wait_for(lambda: pool_stats("timeout stats pool").workers_replaced == 2, 20)
    assert pool_stats("timeout stats pool").timeouts == 2


def test_pools_are_kept_apart_by_name_and_shown_in_the_table(pool):
    call(pf.double, [tf.constant([1])], tf.int32, pool)
    with pfb.ProcessPool(1, name="other stats pool") as other:
        for _ in range(2):
            call(pf.double, [tf.constant([1])], tf.int32, other)
    snapshot = pfb.stats()
    assert snapshot.pools["stats pool"].calls == 1
    assert snapshot.pools["other stats pool"].calls == 2
    table = str(snapshot)
    assert "copies saved" in table and "other stats pool" in table


def test_a_closed_pools_counts_stay_until_reset():
    with pfb.ProcessPool(1, name="closed stats pool") as closing:
        call(pf.double, [tf.constant([1])], tf.int32, closing)
    assert pool_stats("closed stats pool").calls == 1
    pfb.reset_stats()
    assert "closed stats pool" not in pfb.stats().pools


def test_nothing_is_counted_while_statistics_are_off(pool):
    pfb.enable_stats(False)
    try:
        call(pf.double, [tf.constant([1])], tf.int32, pool)
        # A timeout, and the replacement of its worker (close() waits for it).
        with pfb.ProcessPool(1, name="off timeout pool", timeout=0.5) as timing:
            with pytest.raises(tf.errors.DeadlineExceededError):
                call(pf.hang, [tf.constant(60.0)], tf.int64, timing)
    finally:
        pfb.enable_stats(True)
    assert "stats pool" not in pfb.stats().pools
    assert "off timeout pool" not in pfb.stats().pools


def test_an_unanswered_call_is_not_counted():
    """A call whose worker died has no worker times: it counts as a
    replacement, not as a call."""
    with pfb.ProcessPool(1, name="dying stats pool") as dying:
        with pytest.raises(tf.errors.UnknownError, match="exited with status 3"):
            call(pf.exits, [tf.constant(3)], tf.int64, dying)
        # (The replacement counts once it started, after the call failed.)
        wait_for(lambda: getattr(pfb.stats().pools.get("dying stats pool"), "workers_replaced",
                                 0) == 1, 60)
    s = pool_stats("dying stats pool")
    assert (s.calls, s.calls_failed, s.workers_replaced) == (0, 1, 1)


def test_calls_failed_counts_the_pools_failures_on_every_path():
    """A call the pool fails (ended for its timeout, or its worker died)
    counts once in calls_failed, and not in calls, when it goes through
    Python (eager, a graph's first call) as when the kernel makes it
    (test_pool_route.py); the function's errors count each once."""
    with pfb.ProcessPool(1, name="failing stats pool", timeout=0.5) as one:
        with pytest.raises(tf.errors.DeadlineExceededError):
            call(pf.hang, [tf.constant(60.0)], tf.int64, one)
        with pytest.raises(tf.errors.DeadlineExceededError):
            tf.function(lambda x: call(pf.hang, [x], tf.int64, one))(tf.constant(60.0))
        with pytest.raises(tf.errors.UnknownError, match="exited with status 3"):
            call(pf.exits, [tf.constant(3)], tf.int64, one)
        s = pool_stats("failing stats pool")
        assert (s.calls_failed, s.calls, s.timeouts) == (3, 0, 2)
        functions = pfb.stats().functions
        assert (functions["hang"].errors, functions["exits"].errors) == (2, 1)


def test_two_names_of_one_function_count_apart(pool):
    """One Python function under two op names: each name counts its own
    calls, the kernel's native ones included (a graph's later calls and a
    tf.data map run without Python over a route), and the pool all of them."""
    before = getattr(pfb.stats().pools.get("stats pool"), "calls", 0)
    twice_a = tf.function(lambda x: call(pf.double, [x], tf.float64, pool, name="twice_a"))
    for _ in range(3):
        assert float(twice_a(tf.constant(1.0, tf.float64))) == 2.0
    mapped = tf.data.Dataset.range(20).map(
        lambda i: call(pf.double, [tf.cast(i, tf.float64)], tf.float64, pool, name="twice_b"))
    assert [float(v) for v in mapped] == [2.0 * i for i in range(20)]
    functions = pfb.stats().functions
    assert (functions["twice_a"].calls, functions["twice_b"].calls) == (3, 20)
    assert pool_stats().calls - before == 23


def test_the_pool_table_keeps_wide_numbers_apart(pool):
    # A new user's table read "1736.0 us1551545.6 us": columns ran together
    # once a number outgrew its fixed width.
    call(pf.double, [tf.constant([1])], tf.int32, pool)
    snapshot = pfb.stats()
    counted = snapshot.pools["stats pool"]
    wide = dataclasses.replace(counted, seconds_queued=1736.0e-6 * counted.calls,
                               seconds_in_workers=1.5515456 * counted.calls,
                               bytes_in=1023 * 2**30, copies_saved=10**15)
    lines = str(dataclasses.replace(snapshot, pools={"stats pool": wide})).splitlines()
    header = next(line for line in lines if line.startswith("pool"))
    row = next(line for line in lines if line.startswith("stats pool"))
    cells = re.split(r"\s{2,}", row)
    assert len(cells) == len(re.split(r"\s{2,}", header))
    assert cells[2:4] == ["1736.0 us", "1551545.6 us"]
    assert cells[6] == str(10**15)
