"""The kernel's native route to a pool (src/kernel/pool_route.*, through
src/pool/dispatch.h): which calls take it, what it hands back to Python, and
the lifetimes of what it makes (output tensors over a worker's result arena,
the dispatcher behind a kernel).  tests/pool/test_pool_native.py checks values,
errors and statistics against in-process, whichever way the calls go."""
import gc
import os
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import process_functions as pf
from conftest import in_arena, serving, wait_for


def mapped(pool, f, n=32, dtype=tf.float32, inputs=None):
    """`f` over range(n) in a parallel tf.data map through `pool` (calls on
    TF's threads: the route's calls after the first)."""
    dataset = tf.data.Dataset.range(n).map(
        lambda i: pfb.numpy_function(f, [tf.cast(i, tf.float32)] if inputs is None
                                     else inputs(i), dtype, executor=pool),
        num_parallel_calls=4, deterministic=True)
    return list(dataset)


def attached(pool):
    """Waits until every worker serves its ring (calls that find no worker
    attached take the Python path whole), then clears the statistics of the
    calls that showed it."""
    serving(pool)
    pfb.reset_stats()
    return pool


def pool_stats(pool):
    """The pool's statistics, which say which way its calls went (its
    kernel's, or through Python) and what the kernel shared and copied."""
    return pfb.stats().pools[pool.name]


def through_python(pool):
    """The pool's calls whose reply went to Python (eager, a route's first,
    a reply that Python converts)."""
    s = pool_stats(pool)
    return s.calls - s.calls_in_kernel


def result_maps(name):
    with open("/proc/self/maps") as f:
        return [line for line in f if f"/memfd:{name}-results" in line]


def test_a_map_runs_natively_after_its_first_calls_and_counts_them():
    with pfb.ProcessPool(2, name="route pool") as pool:
        out = mapped(attached(pool), pf.double, n=64)
        assert [float(v) for v in out] == [2.0 * i for i in range(64)]
        counts = pool_stats(pool)
        # A parallel map's first calls (one per thread that ran before the
        # route came back) go over the rings from Python, the rest natively;
        # each is counted once.
        assert counts.calls == 64 and 48 <= counts.calls_in_kernel <= 63
        assert counts.bytes_in == 4 * 64 and counts.bytes_out == 4 * 64


def test_eager_calls_are_counted_once_with_their_results_in_the_arena():
    """Eager calls go over the rings from Python (Route.call): each is
    counted once for the pool, and its result views its worker's arena."""
    previous = pfb.enable_stats(True)
    pfb.reset_stats()
    try:
        with pfb.ProcessPool(1, name="eager route pool") as pool:
            for i in range(3):
                out = pfb.numpy_function(pf.double, [tf.fill([256], float(i))], tf.float32,
                                         executor=pool)
                assert out.numpy().tolist() == [2.0 * i] * 256
                assert in_arena(pool, out)
            assert pfb.stats().pools["eager route pool"].calls == 3
    finally:
        pfb.enable_stats(previous)


def test_outputs_outlive_the_pool_and_then_their_mapping_goes():
    """An output over a worker's result block stays valid after close():
    it holds the dispatcher's own mapping of that arena, which goes with
    the last such tensor."""
    name = "outliving route pool"
    pool = pfb.ProcessPool(1, arena_bytes=1 << 22, name=name)
    try:
        attached(pool)
        big = lambda i: tf.fill([1 << 16], i)  # 256 KiB: a fresh result in the arena
        outs = mapped(pool, pf.double, n=8, inputs=lambda i: [big(tf.cast(i, tf.float32))])
        assert pool_stats(pool).calls_in_kernel >= 4
    finally:
        pool.close()
    gc.collect()
    # The dispatcher's mapping (and Python's, which the outputs of the
    # map's first calls, made by the Python path, hold).
    assert 1 <= len(result_maps(name)) <= 2
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.numpy(), np.full(1 << 16, 2.0 * i, np.float32))
    del out, outs
    gc.collect()
    assert result_maps(name) == []


def test_copy_true_outputs_are_copies_and_inputs_are_writable():
    with pfb.ProcessPool(1, name="copy route pool") as pool:
        attached(pool)
        dataset = tf.data.Dataset.range(16).map(
            lambda i: pfb.numpy_function(pf.double_in_place, [tf.fill([4], i)], tf.int64,
                                         executor=pool, copy=True),
            num_parallel_calls=4, deterministic=True)
        assert [v.numpy().tolist() for v in dataset] == [[2 * i] * 4 for i in range(16)]
        counts = pool_stats(pool)
        # (The calls through Python are copied by the conversion layer.)
        assert counts.calls == 16
        assert counts.bytes_out_copied == 32 * counts.calls_in_kernel > 0
        assert counts.bytes_out_shared == 0


def test_errors_and_pickled_values_come_back_through_python():
    with pfb.ProcessPool(1, name="reply route pool") as pool:
        attached(pool)
        # Returns a Python float: not memory, so the reply goes to Python,
        # whose checks convert it as they do in-process.
        assert [float(v) for v in mapped(pool, pf.as_python_float, n=16)] == [
            float(i) for i in range(16)]
        assert through_python(pool) >= 8
        # The map's first calls run natively; the sixth raises in the worker.
        replied = through_python(pool)
        with pytest.raises(tf.errors.InvalidArgumentError, match="input 5 is too large"):
            mapped(pool, pf.fail_from_five, n=8)
        assert through_python(pool) > replied


def test_a_worker_killed_during_a_native_call_fails_it_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("PFB_TEST_MARKS", str(tmp_path))  # element 8 marks (the workers inherit it)
    with pfb.ProcessPool(1, name="killed route pool") as pool:
        box = {}

        def run():
            try:
                mapped(pool, pf.sleep_at_eight, n=12)  # elements 0-7 set the route up
            except tf.errors.OpError as exc:
                box["error"] = exc
        (victim,) = attached(pool).pids()
        thread = threading.Thread(target=run)
        thread.start()
        wait_for(lambda: os.listdir(tmp_path) == [str(victim)], 30)  # in element 8
        os.kill(victim, signal.SIGKILL)
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert isinstance(box.get("error"), tf.errors.UnknownError)
        assert "WorkerError" in str(box["error"]) and "killed" in str(box["error"])
        assert pool_stats(pool).calls_failed >= 1
        wait_for(lambda: pool.pids() not in ([], [victim])  # replaced, and counted so
                 and pfb.stats().pools["killed route pool"].workers_replaced == 1, 60)
        assert [float(v) for v in mapped(pool, pf.double, n=8)] == [2.0 * i for i in range(8)]


def test_close_unmaps_the_input_arena_though_routes_live_on():
    """Routes outlive their pool (the statistics keep them, a kernel may),
    and so does the dispatcher behind them: its own mapping of the input
    arena still goes at close (each such pool kept 64 MiB of shared memory
    until exit before)."""
    name = "unmapped route pool"
    pool = attached(pfb.ProcessPool(2, name=name))
    try:
        mapped(pool, pf.double, n=16)
    finally:
        pool.close()
    gc.collect()
    with open("/proc/self/maps") as f:
        assert not [line for line in f if f"/memfd:{name}-inputs" in line]
    assert pfb.stats().pools[name].calls == 16  # what the routes counted stays readable


EMPTY = {  # empty inputs made as TF makes them: some have no memory at all
    "zeros": lambda i: tf.zeros([0]) + tf.cast(i, tf.float32),
    "fill": lambda i: tf.fill([tf.cast(i, tf.int32) * 0], 1.0),
    "slice": lambda i: tf.range(5.0)[:tf.cast(i, tf.int32) * 0],
    "2x0": lambda i: tf.zeros([2, 0], tf.float32) + tf.cast(i, tf.float32),
}


@pytest.mark.parametrize("copy", [None, False, True])
def test_empty_inputs_are_writable_unless_copy_false_on_every_path(copy):
    """The input policy (writable inputs, copy=False: read-only views) holds
    for empty ones too: in-process, eagerly through a pool (the Python path)
    and in a pool's parallel map (its first calls on the Python path, the
    rest natively)."""
    with pfb.ProcessPool(1, name="empty route pool") as pool:
        attached(pool)
        for name, make in {"nonempty": lambda i: tf.fill([3], 1.0), **EMPTY}.items():
            for executor in (None, pool):
                eager = pfb.numpy_function(pf.writable, [make(tf.constant(0, tf.int64))],
                                           tf.bool, copy=copy, executor=executor)
                mapped = tf.data.Dataset.range(16).map(
                    lambda i: pfb.numpy_function(pf.writable, [make(i)], tf.bool, copy=copy,
                                                 executor=executor),
                    num_parallel_calls=4)
                seen = {bool(eager), *(bool(v) for v in mapped)}
                assert seen == {copy is not False}, (name, executor)
        assert pool_stats(pool).calls_in_kernel > 0
