"""Issue 19's proof that dispatching a pool call needs no GIL in this
process: pool calls of a prefetching tf.data pipeline keep completing while
a thread of this process holds the GIL for a second.  Written against the
public API only (`executor=`), so that it holds whichever route a pool call
takes; tests/pool/test_pool_ring_calls.py and test_pool_timeout_native.py
use its harness."""
import ctypes
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

STAMP_SECONDS = 0.01


def stamp(_):
    """The worker's clock when the call ends.  The nap keeps the two workers
    slower than the consumer (200 elements/s at most), so the pipeline's
    buffers are nearly empty when the GIL is taken and have room to fill."""
    time.sleep(STAMP_SECONDS)
    return np.int64(time.time_ns())


PARALLEL_CALLS = 4
PREFETCH = 64
# A pool call whose dispatch needs this process's GIL stops while a thread
# holds it; the calls a worker already had (PARALLEL_CALLS at most, 10 ms
# each) still end inside the held second.  A dispatch that needs no GIL
# keeps completing calls until the buffers that the blocked consumer does
# not empty are full: the prefetch buffer, the map's PARALLEL_CALLS results
# and the element the consumer's GetNext holds, about 69, which the workers
# fill in under 0.4 s.  The threshold sits between the two, clear of both.
THRESHOLD = 16


def ended_while_the_gil_is_held(stamped, paced=None):
    """Maps `stamped(i)` (tf ops giving the time_ns at which element i was
    made) over Dataset.range (after the `paced` transformation, if any)
    with PARALLEL_CALLS and PREFETCH; a consumer thread reads it while this
    thread holds the GIL for 1 s inside a C call.  Returns how many elements were made during that
    second.  The consumer needs the GIL for each element, so it stops while
    the GIL is held; tf.data's threads are C++ and fill the buffers
    meanwhile, as far as the map's function can run without the GIL."""
    dataset = tf.data.Dataset.range(1 << 30)
    if paced is not None:
        dataset = dataset.apply(paced)
    dataset = dataset.map(stamped, num_parallel_calls=PARALLEL_CALLS).prefetch(PREFETCH)
    stamps, errors = [], []
    flowing = threading.Event()
    stop_at = []  # the number of stamps after which the consumer stops

    def consume():
        try:
            for value in dataset:
                stamps.append(int(value))
                if len(stamps) >= 50:  # a pool's workers both have the function by now
                    flowing.set()
                if stop_at and len(stamps) >= stop_at[0]:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            flowing.set()

    consumer = threading.Thread(target=consume, name="consumer", daemon=True)
    consumer.start()
    try:
        assert flowing.wait(60), "no elements within 60 s"
        assert not errors, errors
        held_from = time.time_ns()
        ctypes.PyDLL(None).usleep(1_000_000)  # PyDLL keeps the GIL: no Python thread runs
        held_to = time.time_ns()
    finally:
        # Past every element that can have been made during the hold, so
        # that their stamps are all read.
        stop_at.append(len(stamps) + PREFETCH + PARALLEL_CALLS + 64)
        consumer.join(120)
    assert not consumer.is_alive(), "the consumer did not finish within 120 s"
    assert not errors, errors
    assert held_to - held_from >= 1_000_000_000
    during = sum(1 for s in stamps if held_from < s < held_to)
    print(f"{during} elements made while the GIL was held for 1 s "
          f"({len(stamps)} elements read)")
    return during


def test_the_pipeline_fills_its_buffers_while_a_thread_holds_the_gil():
    """The harness without a pool: TensorFlow's own ops, behind tf.data's
    sleep (C++, no GIL) at the pace the workers' nap sets, fill the buffers
    while the GIL is held, so the pool test below measures the pool's
    dispatch, not tf.data or the harness."""
    testing = pytest.importorskip("tensorflow.python.data.experimental.ops.testing")
    during = ended_while_the_gil_is_held(
        lambda i: tf.cast(tf.timestamp() * 1e9, tf.int64),
        paced=testing.sleep(int(STAMP_SECONDS * 1e6) // 2))  # two workers' pace
    assert during >= THRESHOLD


def test_pool_calls_keep_completing_while_a_thread_holds_the_gil():
    with pfb.ProcessPool(2, name="native GIL pool") as pool:
        during = ended_while_the_gil_is_held(
            lambda i: pfb.numpy_function(stamp, [i], tf.int64, executor=pool))
    assert during >= THRESHOLD, (
        f"only {during} pool calls ended while a thread held the GIL for 1 s: "
        f"pool calls need this process's GIL")
