"""Faults found by an adversarial pass over the kernel's native route to a
pool (src/kernel/pool_route.*, src/pool/dispatch.*): each test failed on the
code before its fix.  A call takes the route in a tf.data map, on TF's
threads, after the kernel's first call; the same map while a profiler
records (bridge.cc offers kernels no route then) takes the rings from
Python for every call (ProcessPool.ring_call), the reference for what the
native path must do and report."""
import contextlib
import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

import tensorflow as tf

import pyfunc_bridge as pfb
import copy_functions as cf
import process_functions as pf

from conftest import serving
from fresh_python import fresh_python


POOL_NAME = "route faults pool"


def native_calls(pool):
    """The calls the pool's kernel completed itself: a test's premise that
    its calls went natively."""
    return pfb.stats().pools[pool.name].calls_in_kernel


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name=POOL_NAME) as shared:
        yield serving(shared)  # (a call that finds no worker serving takes the Python path)


@pytest.fixture(scope="module")
def python_path_pool():
    """A pool of the same name (so the same record) whose calls are all
    made while a profiler records (python_path)."""
    with pfb.ProcessPool(1, name=POOL_NAME) as shared:
        yield shared


@contextlib.contextmanager
def python_path(logdir):
    """Every pool call from Python while it lasts: kernels take no route
    while a profiler records (bridge.cc, may_route)."""
    tf.profiler.experimental.start(str(logdir))
    try:
        yield
    finally:
        tf.profiler.experimental.stop()


def counted(pool, func, make, dtype, n=12, logdir=None):
    """The results and pfb.stats() of a sequential tf.data map of `n` calls
    of `func` (input `make(i)`) in `pool`; with `logdir`, all on the Python
    path."""
    pfb.reset_stats()
    dataset = tf.data.Dataset.range(n).map(
        lambda i: pfb.numpy_function(func, [make(i)], dtype, executor=pool,
                                     name="route_fault_fn"))
    with python_path(logdir) if logdir is not None else contextlib.nullcontext():
        results = [tf.nest.map_structure(lambda t: np.asarray(t).tolist(), out) for out in dataset]
    snapshot = pfb.stats()
    pool_record = dataclasses.asdict(snapshot.pools[POOL_NAME])
    del pool_record["seconds_queued"], pool_record["seconds_in_workers"]
    function = snapshot.functions["route_fault_fn"]
    return pool_record, (function.calls, function.errors, function.bytes_zero_copy,
                         function.bytes_copied), results


def floats(i):
    return tf.fill([64], tf.cast(i, tf.float32))


def one_float(i):
    return tf.fill([1], tf.cast(i, tf.float32))


@pytest.mark.parametrize("func, make, dtype", [
    # A result the worker copies into its arena (an input view; a fresh
    # array under the handler's 64 KiB): copies_saved counts it (handed
    # over from shared memory without a copy here), and the worker's copy
    # counts in the function's "worker" bytes.
    (pf.identity, floats, tf.float32),
    (pf.double, floats, tf.float32),
    (pf.two_results, floats, [tf.float32, tf.float32]),
    # Strings come back pickled: their bytes count in bytes_out.
    (pf.upper, lambda i: tf.strings.as_string(tf.fill([3], i)), tf.string),
    (pf.identity, lambda i: tf.strings.as_string(i), tf.string),
    # numpy_function's usual NumPy scalar; a 0-d input (a NumPy scalar for
    # the function: a value, not a copy).
    (pf.pid, one_float, tf.int64),
    (pf.double, lambda i: tf.cast(i, tf.float64), tf.float64),
    # Each path describes its own values by one rule (input_records.h):
    # strings with empty elements and NULs, no elements, other dtypes.
    (pf.identity, lambda i: tf.reshape(tf.stack([tf.strings.as_string(i), "", "x\0y",
                                                 tf.strings.as_string(i * 7)]), [2, 2]),
     tf.string),
    (pf.identity, lambda i: tf.fill([0, 2], tf.strings.as_string(i)), tf.string),
    (pf.identity, lambda i: tf.fill([2, 3, 4], i % 2 == 0), tf.bool),
    (pf.identity, lambda i: tf.zeros([0, 3], tf.int8) + tf.cast(i, tf.int8), tf.int8),
], ids=["input view", "fresh", "two results", "strings", "0-d string", "numpy scalar",
        "0-d input", "2-d strings", "no strings", "bool", "no numbers"])
def test_native_calls_count_as_the_python_path_counts(pool, python_path_pool, stats_on, func,
                                                      make, dtype, tmp_path):
    reference = counted(python_path_pool, func, make, dtype, logdir=tmp_path)
    native = counted(pool, func, make, dtype)
    # Which way the calls went may differ (strings come back to Python
    # either way), and is all that does: results and every other count agree.
    way = {"calls_in_kernel": 0, "bytes_out_shared": 0, "bytes_out_copied": 0}
    assert {k: reference[0].pop(k) for k in way} == way
    for k in way:
        del native[0][k]
    assert native[:2] == reference[:2]
    assert func is pf.pid or native[2] == reference[2]  # (pid: each pool's worker)


def test_a_full_input_arena_sends_native_calls_to_python_at_once():
    """A function that keeps its inputs fills the input arena for good.  The
    Python path sees that no call in flight holds blocks, so the room there
    is all there will be, and sends the inputs pickled at once; the native
    path waited a second for room before each call though no native call
    in flight could free any (24 calls in a map of two parallel calls: 10 s,
    against 0.1 s on the Python path)."""
    with serving(pfb.ProcessPool(1, arena_bytes=1 << 20, name="full arena pool")) as pool:
        dataset = tf.data.Dataset.range(24).map(
            lambda i: pfb.numpy_function(pf.keeps_its_input,
                                         [tf.fill([65536], tf.cast(i, tf.float32))],
                                         tf.float32, executor=pool),  # 256 KiB each
            num_parallel_calls=2, deterministic=True)  # a call waits while one is in flight
        began = time.monotonic()
        out = list(dataset)
        took = time.monotonic() - began
        assert [float(v[0]) for v in out] == [2.0 * i for i in range(24)]
        # Four inputs fill the arena; the others go pickled, each after a
        # full second's wait before the fix (a stall, not a speed: at least
        # 10 s, against a fraction of one).
        assert took < 5, f"24 calls took {took:.1f} s"


def test_result_blocks_of_dropped_native_outputs_go_back_with_python_path_calls(stats_on):
    """A native output's block goes back to its worker with the next request
    the dispatcher posts to it.  When the worker's later calls are all on the
    Python path (eager calls), they carried none of those blocks: its result
    arena stayed full of results nobody held, and eager results that would
    have come back in shared memory came back pickled (half of them)."""
    with serving(pfb.ProcessPool(1, arena_bytes=1 << 22, name="blocks back pool")) as pool:
        dataset = tf.data.Dataset.range(16).map(
            lambda i: pfb.numpy_function(cf.large_fresh, [i], tf.float32, executor=pool),
            num_parallel_calls=2)  # 16 x 256 KiB: the 4 MiB arena
        outputs = list(dataset)
        assert native_calls(pool) >= 10
        del outputs  # (their blocks wait for a request to the worker)
        pfb.reset_stats()
        kept = [pfb.numpy_function(cf.large_fresh, [tf.constant(i)], tf.float32, executor=pool)
                for i in range(8)]  # eager: the Python path
        assert all(float(tf.reduce_sum(k)) == 1 << 16 for k in kept)
        assert pfb.stats().pools["blocks back pool"].copies_saved == 8


def killed_mid_call(pool, name):
    """A sequential map of sleep_at_eight over `pool`, whose worker is
    killed while it runs element 8 (elements 0-7 answered); pfb.stats()'s
    records of the pool and of the function.  The caller picks the path
    (python_path)."""
    pfb.reset_stats()
    errors = []

    def run():
        dataset = tf.data.Dataset.range(12).map(lambda i: pfb.numpy_function(
            pf.sleep_at_eight, [tf.cast(i, tf.float32)], tf.float32, executor=pool,
            name="killed_fn"))
        try:
            list(dataset)
        except tf.errors.OpError as exc:
            errors.append(exc)
    (victim,) = pool.pids()
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while pfb.stats().functions.get("killed_fn", None) is None or \
            pfb.stats().functions["killed_fn"].calls < 8:
        assert time.monotonic() < deadline, "elements 0-7 never ran"
        time.sleep(0.01)
    time.sleep(0.3)  # element 8 sleeps in the worker
    os.kill(victim, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive() and len(errors) == 1
    snapshot = pfb.stats()
    return snapshot.pools[name], snapshot.functions["killed_fn"]


def test_a_call_failed_by_its_worker_s_death_is_not_counted_as_answered(stats_on, tmp_path):
    """The pool's calls and bytes_in count the calls its workers answered;
    a call whose worker died is the function's error only.  The native
    route counted it in the pool's record too."""
    name = "killed stats pool"
    with pfb.ProcessPool(1, name=name) as python_path_pool, python_path(tmp_path):
        pool_record, function = killed_mid_call(python_path_pool, name)
        assert (function.calls, function.errors) == (9, 1)
        assert (pool_record.calls, pool_record.bytes_in) == (8, 32)
    with serving(pfb.ProcessPool(1, name=name)) as pool:
        pool_record, function = killed_mid_call(pool, name)
        assert native_calls(pool) >= 4
        assert (function.calls, function.errors) == (9, 1)
        assert (pool_record.calls, pool_record.bytes_in) == (8, 32)


# Daemon threads iterate tf.data maps through a pool (natively, after each
# map's first calls) while the main thread ends.
_EXIT_SCRIPT = "pool/route_faults_exit.py"


def test_maps_in_daemon_threads_end_quietly_at_exit():
    """A daemon thread whose pool call fails because the pool was closed at
    exit ends silently.  A map's call that began after the close said the
    pool "is closed", which the exit's filter did not know: tracebacks at
    most exits (the native route's call finds the pool closed, and the
    Python path that takes it over says so)."""
    for _ in range(2):
        run = fresh_python(_EXIT_SCRIPT, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Traceback" not in run.stderr, run.stderr[-3000:]


def scalar_sum(x):
    """np.float64(x.sum()), a NumPy scalar (a PFB_POOL_TENSOR_SCALAR record).
    With x[0] > 0 the worker then sends a corrupt DONE, as a broken worker
    would: the record claims 1 byte of its block for the scalar's 8 (its
    block stays a real one, which the parent hands back)."""
    from pyfunc_bridge.worker import ring_server
    server = ring_server.RingServer
    if "honest_encode" not in server.__dict__:
        server.honest_encode = server.encode
    honest = server.honest_encode
    if x[0] > 0:
        def encode(self, value, framework, facts, index=0):
            record = honest(self, value, framework, facts, index)
            return (*record[:5], 1, record[6])
        server.encode = encode
    else:
        server.encode = honest
    return np.float64(x.sum())


def test_a_corrupt_done_is_refused_alike_eagerly_and_natively(pool, stats_on):
    """One decoder of a DONE (src/pool/reply_decode.c) checks every result
    block, for the kernel's native calls and Python's: a block too small
    for its result is refused with one error on both paths (before, a
    scalar's short block reached np.frombuffer, ValueError)."""
    text = r"a worker described a result block \(\d+, 1\) that does not hold 8 bytes"
    with pytest.raises(Exception, match=text):
        pfb.numpy_function(scalar_sum, [np.ones(2)], tf.float64, executor=pool)
    assert float(pfb.numpy_function(scalar_sum, [np.zeros(2)], tf.float64,
                                    executor=pool)) == 0.0

    def mapped(firsts):
        """A tf.data map of the function over rows [first, 0]."""
        rows = tf.constant([[first, 0.0] for first in firsts], tf.float64)
        return tf.data.Dataset.from_tensor_slices(rows).map(
            lambda x: pfb.numpy_function(scalar_sum, [x], tf.float64, executor=pool))

    # The kernel's first call offers it the route; its later ones go
    # natively (the premise: some did), the corrupt one last.
    before = native_calls(pool)
    with pytest.raises(tf.errors.OpError, match=text):
        list(mapped([0.0] * 12 + [1.0]))
    assert native_calls(pool) > before
    assert [float(v) for v in mapped([0.0] * 3)] == [0.0] * 3  # the worker serves on
