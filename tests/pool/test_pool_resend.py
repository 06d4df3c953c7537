"""Calls that a dead worker never started go to another worker (issue 28,
item 5): a worker killed while idle fails none of the calls posted to it
before the pool saw it die, whoever made the call (an eager call from
Python, a tf.data map's kernel natively; both over the rings).  A call the worker had started still
fails with WorkerError (tests/pool/test_process_pool_faults.py, tests/kernel/test_faults.py).

Written against the public API (`executor=`, `pids()`, `pfb.stats()`)."""
import os
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
import pyfunc_bridge as pfb

CALLS = 30


def _kill_idle(pool, name):
    """SIGKILLs the worker that takes the next call (the first free one),
    which runs nothing now; returns its pid."""
    victim = pool.pids()[0]
    replaced = pfb.stats().pools[name].workers_replaced
    os.kill(victim, signal.SIGKILL)
    return victim, replaced


def _replaced(pool, name, victim, replaced, workers):
    """Waits until the pool replaced `victim` (its statistics say so)."""
    wait_for(lambda: pfb.stats().pools[name].workers_replaced == replaced + 1
             and victim not in pool.pids() and len(pool.pids()) == workers, seconds=60)


@pytest.mark.parametrize("workers", [1, 2])
def test_eager_calls_posted_to_a_worker_killed_while_idle_run_elsewhere(workers):
    name = f"resend eager pool {workers}"
    with pfb.ProcessPool(workers, name=name) as pool:
        assert int(pfb.numpy_function(pf.plus_one, [tf.constant(0, tf.int64)], tf.int64,
                                      executor=pool)) == 1
        victim, replaced = _kill_idle(pool, name)
        results, errors = {}, []

        def call(start):
            try:
                for i in range(start, CALLS, 6):
                    results[i] = int(pfb.numpy_function(
                        pf.plus_one, [tf.constant(i, tf.int64)], tf.int64, executor=pool))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors[0]
        assert results == {i: i + 1 for i in range(CALLS)}
        _replaced(pool, name, victim, replaced, workers)


@pytest.mark.parametrize("parallel", [None, 4])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_map_s_native_calls_posted_to_a_worker_killed_while_idle_run_elsewhere(
        workers, parallel):
    name = f"resend map pool {workers} {parallel}"
    with pfb.ProcessPool(workers, name=name) as pool:
        # Its first call sets up the kernel's route; the pool is idle after it.
        dataset = tf.data.Dataset.range(CALLS + 1).map(
            lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool),
            num_parallel_calls=parallel, deterministic=True if parallel else None)
        iterator = iter(dataset)
        assert int(next(iterator)) == 1
        if parallel:  # the map runs ahead: its calls are answered first
            wait_for(lambda: pfb.stats().pools[name].calls >= min(1 + parallel, CALLS))
        victim, replaced = _kill_idle(pool, name)
        assert [int(v) for v in iterator] == list(range(2, CALLS + 2))
        _replaced(pool, name, victim, replaced, workers)
        # The replacement serves the route too.
        again = tf.data.Dataset.range(CALLS).map(
            lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool))
        assert list(again.as_numpy_iterator()) == list(range(1, CALLS + 1))
