"""A pool's timeout on the rings (issue 28, "timeouts"): a pool with a
`timeout` answers a graph-mode tf.data map natively, as a pool without one
does, and a native call that overruns fails with the timeout's error while
the calls its worker had not started run in another worker.

Written against the public API (`executor=`, `pids()`, `pfb.stats()`); the
sign of native calls is the one of tests/pool/test_pool_native_gil.py: they
keep completing while a thread of this process holds the GIL."""
import re
import threading

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
from test_pool_native_gil import THRESHOLD, ended_while_the_gil_is_held, stamp
import pyfunc_bridge as pfb

NAME = "native timeout pool"
TIMEOUT = 2.0
ELEMENTS = 40


def test_a_pool_with_a_timeout_answers_a_map_natively_and_ends_an_overrun(stats_on):
    # One worker: the calls the map posts while element 20 hangs all wait
    # in that worker's ring, unstarted, when it is ended.
    with pfb.ProcessPool(1, timeout=TIMEOUT, name=NAME) as pool:
        during = ended_while_the_gil_is_held(
            lambda i: pfb.numpy_function(stamp, [i], tf.int64, executor=pool))
        assert during >= THRESHOLD, (
            f"only {during} calls of a pool with a timeout ended while a thread held the "
            f"GIL for 1 s: they took the Python path, not the rings")

        (first,) = pool.pids()
        replaced = pfb.stats().pools[NAME].workers_replaced
        dataset = tf.data.Dataset.range(ELEMENTS).map(
            lambda i: pfb.numpy_function(pf.hang_at_twenty, [i], tf.int64, executor=pool),
            num_parallel_calls=4, deterministic=True)
        got, errors = {}, {}

        def consume():
            iterator = iter(dataset)
            for i in range(ELEMENTS):
                try:
                    got[i] = next(iterator).numpy().tolist()
                except tf.errors.OpError as exc:  # the map goes on after an element's error
                    errors[i] = exc

        consumer = threading.Thread(target=consume)
        consumer.start()
        consumer.join(timeout=120)  # (element 20's sleep ends in 60 s anyway)
        if consumer.is_alive():
            pool.close()  # fails the calls in flight, so the thread ends
            consumer.join(timeout=60)
            pytest.fail("the map did not end within 120 s")

        assert list(errors) == [20], errors
        error = errors[20]
        assert isinstance(error, tf.errors.DeadlineExceededError), repr(error)
        assert f"ran past the {TIMEOUT:g} s timeout of {NAME} in worker process {first}" \
            in error.message, error.message
        assert re.search(r'process_functions.py", line \d+ in hang_at_twenty\n',
                         error.message), error.message
        # Every other element ran, and those the map started after 20's
        # were in flight in the worker that replaced the one ended (the calls
        # posted to it were sent again).  (The 3 in flight with 20 may have
        # been posted, and run, before it.)
        assert {i: v[0] for i, v in got.items()} == {
            i: i + 1 for i in range(ELEMENTS) if i != 20}
        assert all(v[1] != first for i, v in got.items() if i > 20 + 3)
        wait_for(lambda: pfb.stats().pools[NAME].workers_replaced == replaced + 1
                 and len(pool.pids()) == 1 and first not in pool.pids(), seconds=60)
        assert pfb.stats().pools[NAME].timeouts == 1
