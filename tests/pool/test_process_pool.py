"""Process workers (executor=): results, data movement, errors, faults and
the pool's lifetime.  Exits (normal, unhandled exception, the default pool at
interpreter exit, a killed parent) run in subprocesses with timeouts and check
/proc and /dev/shm."""
import gc
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import ROOT, TESTS, in_arena, input_arena_whole, script_env, wait_for
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import process_pool as _process
from pyfunc_bridge.pool import worker_process
from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.worker import start_worker

# This file's folder: scripts import this module by name (`import test_process_pool`).
HERE = os.path.dirname(os.path.abspath(__file__))
_worker_file = start_worker.__file__


@pytest.fixture(scope="module")
def pool():
    """One pool for the tests that leave it as they found it (starting one
    costs about half a second)."""
    with pfb.ProcessPool(2, name="test pool") as shared:
        yield shared


# ------------------------------------------------------------------ results --

def test_parallel_deterministic_map_gives_every_result_in_order(pool):
    dataset = tf.data.Dataset.range(300).map(
        lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    assert list(dataset.as_numpy_iterator()) == list(range(1, 301))


def test_eager_and_graph_calls_and_py_func(pool):
    x = tf.constant([1.0, 2.0, 3.0])
    eager = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool)
    graph = tf.function(lambda x: pfb.numpy_function(pf.double, [x], tf.float32,
                                                     executor=pool))(x)
    np.testing.assert_array_equal(eager.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(graph.numpy(), [2.0, 4.0, 6.0])
    with tf.Graph().as_default():
        y = pfb.py_func(pf.double, [tf.constant([1, 2])], tf.int32, executor=pool)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(y), [2, 4])


def test_many_calls_are_in_flight_at_once(pool):
    """Callers wait without the GIL: two threads' calls run in both workers."""
    results = []
    threads = [threading.Thread(target=lambda: results.append(int(pfb.numpy_function(
        pf.slow_pid, [tf.constant(0.5)], tf.int64, executor=pool))))
        for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == sorted(pool.pids())


def test_results_stay_in_shared_memory_without_a_copy(pool):
    x = tf.range(1024, dtype=tf.float32)
    y = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool)
    assert in_arena(pool, y)
    assert pfb.to_numpy(y).ctypes.data % 64 == 0
    copied = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool, copy=True)
    assert not in_arena(pool, copied)
    strict = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool, copy=False)
    assert in_arena(pool, strict)
    np.testing.assert_array_equal(strict.numpy(), np.arange(1024) * 2)


def test_a_result_block_returns_to_its_worker_when_the_tensor_goes():
    """Each result takes a fifth of its worker's arena: were the blocks of
    dropped results not handed back (with the pool's next message to the
    worker), the sixth would not come back through shared memory."""
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="returning pool") as one:
        x = tf.zeros([200 << 10], tf.uint8)
        for i in range(15):
            y = pfb.numpy_function(pf.identity, [x], tf.uint8, executor=one)
            assert in_arena(one, y), i
            del y
            gc.collect()


def test_strings_scalars_and_several_outputs(pool):
    s = pfb.numpy_function(pf.upper, [tf.constant(["ab", "cd"])], tf.string, executor=pool)
    assert s.numpy().tolist() == [b"AB", b"CD"]
    f = pfb.numpy_function(pf.to_float, [tf.constant(1)], tf.float32, executor=pool)
    assert f.numpy() == 2.5 and f.dtype == tf.float32
    a, b = pfb.numpy_function(pf.two_results, [tf.constant([1, 2])], [tf.int32, tf.int32],
                              executor=pool)
    assert a.numpy().tolist() == [2, 3] and b.numpy().tolist() == [2, 4]
    v = pfb.numpy_function(pf.view_of_input, [tf.range(6)], tf.int32, executor=pool)
    assert v.numpy().tolist() == [0, 2, 4]


def test_array_function_numpy_and_torch(pool):
    x = tf.constant([1.0, 2.0, 3.0])
    got = pfb.array_function(pf.double, [x], tf.float32, framework="numpy", executor=pool)
    np.testing.assert_array_equal(got.numpy(), [2.0, 4.0, 6.0])
    pytest.importorskip("torch")
    got = pfb.array_function(pf.torch_square, [x], tf.float32, framework="torch",
                             executor=pool)
    np.testing.assert_array_equal(got.numpy(), [1.0, 4.0, 9.0])
    assert in_arena(pool, got)


@pytest.mark.parametrize("func, tout", [(pf.returns_a_memoryview, tf.float32),
                                        (pf.returns_an_mmap, tf.uint8),
                                        (pf.returns_an_array_holder, tf.float32)])
def test_objects_that_export_an_array_come_back_as_in_process(pool, func, tout):
    """A result that is not an ndarray but exports one (the bridge takes
    np.asarray of it) and does not pickle."""
    x = tf.range(100_000.0)
    want = pfb.numpy_function(func, [x], tout)
    got = pfb.numpy_function(func, [x], tout, executor=pool)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="still reachable from Python"):
        pfb.numpy_function(func, [x], tout, copy=False, executor=pool)

def test_torch_bfloat16_inputs_and_results(pool, torch):
    """torch has no NumPy type for bfloat16 (TensorFlow's is ml_dtypes'):
    tensor.numpy() and torch.from_numpy refuse it."""
    x = tf.cast(tf.range(100_000.0), tf.bfloat16)
    for func, arg in [(pf.plus_one, x), (pf.identity, x),
                      (pf.torch_bfloat16_ones, tf.constant(100_000))]:
        want = pfb.array_function(func, [arg], tf.bfloat16, framework="torch")
        got = pfb.array_function(func, [arg], tf.bfloat16, framework="torch", executor=pool)
        assert got.dtype == tf.bfloat16
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # copy=False judges a bfloat16 result as any other.
    for executor in (None, pool):
        with pytest.raises(tf.errors.InvalidArgumentError, match="still reachable from Python"):
            pfb.array_function(pf.shared_torch_bfloat16, [x], tf.bfloat16, framework="torch",
                               copy=False, executor=executor)

@pytest.mark.parametrize("shape", [[1000], [0]])
def test_a_torch_function_that_writes_its_input_fails_as_in_process(pool, shape, torch):
    """Without copy=True a torch input is TensorFlow's memory in-process, and
    a write to it fails the call; in a worker the block is the call's own,
    but the function is as wrong."""
    for executor in (None, pool):
        with pytest.raises(tf.errors.InvalidArgumentError, match="wrote to input 0 in place"):
            pfb.array_function(pf.briefly_double_in_place, [tf.ones(shape)], tf.float32,
                               framework="torch", executor=executor)

def test_a_torch_result_that_requires_grad_fails_as_in_process(pool, torch):
    for executor in (None, pool):
        with pytest.raises(tf.errors.UnknownError, match="require gradient"):
            pfb.array_function(pf.torch_requires_grad, [tf.constant(1000)], tf.float32,
                               framework="torch", executor=executor)

def test_payloads_larger_than_the_arena_travel_pickled():
    with pfb.ProcessPool(1, arena_bytes=4096, name="small pool") as small:
        x = tf.range(1 << 14, dtype=tf.float32)  # 64 KiB
        y = pfb.numpy_function(pf.double, [x], tf.float32, executor=small)
        np.testing.assert_array_equal(y.numpy(), np.arange(1 << 14) * 2)
        assert not in_arena(small, y)
        # Many calls at once through one small arena: they wait for room.
        dataset = tf.data.Dataset.range(64).map(
            lambda i: pfb.numpy_function(pf.plus_one, [tf.fill([256], i)], tf.int64,
                                         executor=small),
            num_parallel_calls=8)
        assert [int(v[0]) for v in dataset.as_numpy_iterator()] == list(range(1, 65))


# Only a hang's bound: a script of a few seconds took a minute on a machine
# loaded four times over (TensorFlow's import and the workers' start alone).
SCRIPT_TIMEOUT = 600


def run_script(script, *args):
    """Runs `script` in a fresh interpreter (a hang there fails the test by
    its timeout); it prints "done" at its end."""
    run = subprocess.run([sys.executable, "-c", script, *args], cwd=TESTS,
                         capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
                         env=script_env(ROOT, TESTS, HERE))
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-3000:]


# Hangs (in a subprocess, then) where a call holds some of its inputs' blocks
# while it waits for room for the others.
_INPUTS_TOGETHER_SCRIPT = r"""
import threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(2, arena_bytes=1 << 20) as pool:
    a = tf.ones([600_000], tf.uint8)  # two of them do not fit the arena together
    y = pfb.numpy_function(pf.add, [a, a], tf.uint8, executor=pool)
    assert int(tf.reduce_sum(tf.cast(y, tf.int64))) == 1_200_000
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
    b = tf.ones([400_000], tf.uint8)  # two calls at once: 4 blocks, 2.5 fit
    results, start = [], threading.Barrier(2)
    def call():
        start.wait()
        for _ in range(20):
            results.append(int(tf.reduce_sum(tf.cast(
                pfb.numpy_function(pf.add, [b, b], tf.uint8, executor=pool), tf.int64))))
    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [800_000] * 40, results
print("done")
"""


# Inputs that travel pickled rather than through the arena: empty, and
# larger than the (1 MiB) arena.
_PICKLED_INPUTS = [pytest.param([0, 3], id="empty"), pytest.param([512 << 10], id="2 MiB")]


@pytest.mark.parametrize("shape", _PICKLED_INPUTS)
def test_array_function_gives_torch_tensors_for_inputs_that_travel_pickled(shape, torch):
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="pickled torch pool") as pool:
        for executor in (None, pool):
            got = pfb.array_function(pf.type_name, [tf.ones(shape)], tf.string,
                                     framework="torch", executor=executor)
            assert got.numpy()[0] == b"torch.Tensor", executor


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("shape", _PICKLED_INPUTS)
def test_copy_true_gives_writable_inputs_that_travel_pickled(shape, framework):
    """copy=True promises private writable inputs; an array unpickled from
    the worker's frame is read-only."""
    if framework == "torch":
        pytest.importorskip("torch")
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="pickled copy pool") as pool:
        out = pfb.array_function(pf.briefly_double_in_place, [tf.fill(shape, 3.0)],
                                 tf.float32, framework=framework, copy=True, executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.full(shape, 6.0, np.float32))

def test_a_call_whose_inputs_do_not_fit_the_arena_together_runs():
    run_script(_INPUTS_TOGETHER_SCRIPT)


def test_workers_do_not_share_state_with_this_process():
    pf.calls = 0
    with pfb.ProcessPool(1, name="state pool") as one:
        counted = [int(pfb.numpy_function(pf.stateful, [tf.constant(0)], tf.int64,
                                          executor=one, stateful=True)) for _ in range(3)]
    assert counted == [1, 2, 3]  # one worker: its own module state
    assert pf.calls == 0


def test_closures_and_lambdas_travel_by_value(pool):
    offset = 7
    y = pfb.numpy_function(lambda a: a + offset, [tf.constant([1, 2])], tf.int32,
                           executor=pool)
    assert y.numpy().tolist() == [8, 9]


def test_the_default_pool(monkeypatch):
    # A default pool of this test's own, closed at its end: the default pool
    # has no public handle (it is closed at exit).
    monkeypatch.setattr(_process, "_default", None)
    try:
        y = pfb.numpy_function(pf.double, [tf.constant([3])], tf.int32, executor="process")
        assert y.numpy().tolist() == [6]
        worker = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                        executor="process"))
        with open(f"/proc/{worker}/status") as f:  # a worker process of this one
            assert f"PPid:\t{os.getpid()}\n" in f.read()
    finally:
        _process._default.close()


def test_a_module_on_a_path_added_after_the_pool_started_imports_in_the_workers(
        tmp_path, monkeypatch):
    """Workers see this process's sys.path as it is when a function is first
    sent to them, not as it was when they started."""
    with pfb.ProcessPool(1, name="path pool") as later:
        assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                      executor=later)) in later.pids()  # started, and serving
        folder = tmp_path / "made_later"
        folder.mkdir()
        (folder / "made_at_run_time.py").write_text(
            "import numpy as np\n\ndef triple(a):\n    return a * 3\n")
        monkeypatch.syspath_prepend(str(folder))
        import made_at_run_time
        for _ in range(2):
            y = pfb.numpy_function(made_at_run_time.triple, [tf.constant([1, 2])], tf.int32,
                                   executor=later)
            assert y.numpy().tolist() == [3, 6]


def test_no_default_pool_starts_after_the_pools_closed_at_exit(monkeypatch):
    monkeypatch.setattr(_process, "_default", None)
    monkeypatch.setattr(_process, "_exiting", True)
    with pytest.raises(_process.PoolClosedError, match="closed at interpreter exit"):
        _process.default_pool()
    assert _process._default is None


def test_first_calls_of_a_new_function_from_several_threads_all_run():
    """Several first calls of a function at once on one worker: the request
    that carries the function's pickle must reach the worker before the
    others (a worker that does not know a function fails its call)."""
    with pfb.ProcessPool(1, name="order pool") as order:
        for round in range(10):
            func = lambda a, offset=round: a + offset  # noqa: E731 - new to the worker
            start, results = threading.Barrier(3), []

            def call():
                start.wait()
                try:
                    results.append(pfb.numpy_function(func, [tf.constant([1, 2])], tf.int32,
                                                      executor=order).numpy().tolist())
                except Exception as exc:  # noqa: BLE001 - asserted below
                    results.append(exc)
            threads = [threading.Thread(target=call) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)
            assert results == [[1 + round, 2 + round]] * 3, results


# ------------------------------------------------------------- kept inputs --

def _apply(func, inputs, tout, framework, executor, copy=None):
    """numpy_function, or array_function for a framework other than NumPy."""
    if framework == "numpy":
        return pfb.numpy_function(func, inputs, tout, executor=executor, copy=copy)
    pytest.importorskip(framework)
    return pfb.array_function(func, inputs, tout, framework=framework, executor=executor,
                              copy=copy)


@pytest.fixture(scope="module")
def single():
    """A one-worker pool: a function that keeps state keeps it in one place."""
    with pfb.ProcessPool(1, name="single pool") as one:
        yield one


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_function_that_keeps_its_inputs_reads_them_unchanged(single, framework):
    """An accumulator: the inputs it keeps are not overwritten by the next
    calls' inputs (their blocks stay the worker's while it views them)."""
    def accumulate(executor):
        keep = pf.keeper()
        return [_apply(keep, [tf.fill([2], float(i))], tf.float32, framework,
                       executor).numpy().tolist() for i in range(3)]
    expected = accumulate(None)  # in-process: the oracle
    assert expected[-1] == [0, 0, 1, 1, 2, 2]
    assert accumulate(single) == expected


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_deduplicator_flags_exactly_the_repeated_inputs(single, framework):
    values = [0, 1, 2, 3, 4, 0, 1, 2]

    def flags(executor):
        seen = pf.deduplicator()
        return [bool(_apply(seen, [tf.fill([3], float(v))], tf.bool, framework, executor))
                for v in values]
    expected = flags(None)
    assert expected == [False] * 5 + [True] * 3
    assert flags(single) == expected


def test_a_deduplicating_map_in_a_pool_matches_in_process(single):
    def flags(executor):
        seen = pf.deduplicator()
        dataset = tf.data.Dataset.from_tensor_slices([0, 1, 2, 3, 4, 0, 1, 2]).map(
            lambda v: pfb.numpy_function(seen, [tf.fill([3], v)], tf.bool, executor=executor))
        return [bool(flag) for flag in dataset.as_numpy_iterator()]
    assert flags(single) == flags(None) == [False] * 5 + [True] * 3


def _arena_settled(pool, expected=None):
    """Free bytes of the input arena once, within a few seconds, they are
    `expected` (the callers' calls have returned): blocks that come back in
    a ring's INPUTS_BACK are freed by the dispatcher's reply thread, which
    may run a moment after the call that let go of them returned."""
    deadline = time.monotonic() + 5
    while True:
        free = pool.free_input_bytes
        if expected in (None, free) or time.monotonic() > deadline:
            return free
        time.sleep(0.01)


def test_kept_input_blocks_go_back_when_the_worker_lets_go_of_them(single):
    gc.collect()  # the functions of the tests before: forgotten with the next message
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=single)
    assert _arena_settled(single, single.arena_bytes) == single.arena_bytes
    x = tf.range(1000.0)  # 4000 bytes: one 4032-byte block
    keep = pf.keep_last()
    for _ in range(3):
        assert float(pfb.numpy_function(keep, [x], tf.float32, executor=single)) == 499500.0
    # Each call let go of the input before it; the last one is still held.
    assert _arena_settled(single, single.arena_bytes - 4032) == single.arena_bytes - 4032
    del keep
    gc.collect()  # the worker forgets the function with the next message
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=single)
    assert _arena_settled(single, single.arena_bytes) == single.arena_bytes


# Wrong values, or a hang (in a subprocess, then), where kept blocks are
# reused or where a call waits for room that only a kept block could give.
_KEPT_FILL_THE_ARENA_SCRIPT = r"""
import threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, arena_bytes=64 << 10) as pool:
    keep = pf.keeper()
    for i in range(8):  # 16 KiB each: the first four fill the arena for good
        out = pfb.numpy_function(keep, [tf.fill([4096], float(i))], tf.float32,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.repeat(np.arange(i + 1.0), 4096))
    assert pool.free_input_bytes == 0
    # Calls from several threads at once: each finds the arena kept full and
    # sends its input pickled rather than waiting for room that never comes.
    results = {}
    def call(i):
        x = tf.fill([4096], float(i))
        results[i] = float(tf.reduce_sum(pfb.numpy_function(pf.double, [x], tf.float32,
                                                            executor=pool)))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: 2 * 4096.0 * i for i in range(4)}, results
    del keep
    import gc; gc.collect()
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=pool)
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
print("done")
"""


def test_inputs_kept_by_functions_leave_no_call_waiting_for_room():
    run_script(_KEPT_FILL_THE_ARENA_SCRIPT)


# A hang (in a subprocess, then) where a worker hands back more input
# blocks at once than its reply ring holds: the function that kept 5,000
# inputs is forgotten, and the worker's wait for room on that ring must wake
# the parent's reply thread, which sleeps.
_MANY_INPUTS_BACK_SCRIPT = r"""
import gc, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, arena_bytes=4 << 20) as pool:
    hoard = pf.hoarder()
    held = tf.data.Dataset.range(5000).map(  # tf.data: the native route, over the rings
        lambda i: pfb.numpy_function(hoard, [tf.reshape(i, [1])], tf.int64, executor=pool),
        num_parallel_calls=2)
    assert max(int(n) for n in held) == 5000
    assert pool.free_input_bytes <= pool.arena_bytes - 5000 * 64
    del hoard, held
    gc.collect()  # the worker forgets the function with the next request
    more = tf.data.Dataset.range(50).map(
        lambda i: pfb.numpy_function(pf.double, [i], tf.int64, executor=pool),
        num_parallel_calls=2)
    assert [int(v) for v in more] == [2 * i for i in range(50)]
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
print("done")
"""


def test_a_worker_handing_back_more_inputs_than_its_ring_holds_goes_on():
    run_script(_MANY_INPUTS_BACK_SCRIPT)


def test_a_dead_workers_kept_blocks_go_back_to_the_arena():
    with pfb.ProcessPool(1, name="keeping fault pool") as keeping:
        keep = pf.keeper()
        pfb.numpy_function(keep, [tf.range(100.0)], tf.float32, executor=keeping)
        (victim,) = keeping.pids()
        assert _arena_settled(keeping) < keeping.arena_bytes  # the kept block
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: keeping.pids() not in ([], [victim]))  # replaced
        assert _arena_settled(keeping, keeping.arena_bytes) == keeping.arena_bytes


# Ctrl-C in the waiting caller, again and again, in a fresh interpreter (a
# signal, and a hang to stop by the timeout).  Each interrupted call stays
# with the pool (queued, or in its worker); its blocks must stay its own
# until the worker is done with them: inputs (else the next call's input is
# the block it writes to in place) and results (else they fill the worker's
# result arena).
_INTERRUPTED_SCRIPT = r"""
import signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import in_arena, settled
FRAMEWORK = {framework!r}
BLOCK = 4 << 20  # one 1 Mi-element float32 input or result
main = threading.main_thread()

def call(value):
    x = tf.fill([1 << 20], float(value))
    if FRAMEWORK == "numpy":
        return pfb.numpy_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                                  executor=pool)
    return pfb.array_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                              framework=FRAMEWORK, executor=pool)

def waiting():  # the main thread waits in the pool (its innermost Python frame)
    frame = sys._current_frames().get(main.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"

def interrupt(moment, gate, returned):
    # SIGINT to the main thread at a moment of the call (a state it reaches,
    # never a time, which a loaded machine stretches): at once (its inputs
    # being made), or once it waits for its worker; never once it returned.
    ready = (lambda: True) if moment == "at once" else waiting
    while True:
        with gate:
            if returned:
                return
            if ready():
                signal.pthread_kill(main.ident, signal.SIGINT)
                return
        time.sleep(0.001)

with pfb.ProcessPool(1, arena_bytes=4 * BLOCK, name="interrupted pool") as pool:
    interrupted, most_held = 0, 0
    for i in range(12):
        gate, returned = threading.Lock(), []
        interrupter = threading.Thread(target=interrupt, args=(
            ("at once", "waiting", "waiting")[i % 3], gate, returned))
        try:
            interrupter.start()
            call(100 + i)
            with gate:  # (a SIGINT sent before this lands inside the try)
                returned.append(True)
        except KeyboardInterrupt:
            interrupted += 1
        interrupter.join()
        # The blocks of the calls still with the pool are theirs.
        most_held = max(most_held, pool.arena_bytes - pool.free_input_bytes)
    # (A KeyboardInterrupt raised in a gc callback is ignored: the call runs on.)
    # A call interrupted while its worker is busy keeps its input block
    # until the worker is done with it.
    assert interrupted >= 8 and most_held >= BLOCK, (interrupted, most_held)
    # The next calls run after the abandoned ones, which wrote in place to
    # their own blocks, not to these calls' inputs.
    for value in (10, 11, 12):
        out = call(value)
        np.testing.assert_array_equal(out.numpy(), np.full(1 << 20, 2.0 * value))
    # The abandoned calls' results went back to the worker: its arena still
    # has room for a 4 MiB result, which comes back through shared memory
    # (without copy=True, which copies every result).
    out = pfb.numpy_function(pf.identity, [tf.fill([1 << 20], 1.0)], tf.float32,
                             executor=pool)
    assert in_arena(pool, out)
    settled(pool)
print("done")
"""


# Ctrl-C at any moment of a call: while its inputs are placed, handed to a
# worker, its reply decoded.  Every block must end with an owner: once the
# calls are done, the arena is whole and the values right.
_INTERRUPTED_ANYWHERE_SCRIPT = r"""
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import Interrupts, settled
with pfb.ProcessPool(2, arena_bytes=1 << 20, name="interrupted pool") as pool:
    x = tf.fill([64 << 10], 3.0)  # 256 KiB: four fit the arena
    interrupts = Interrupts(seed=18)
    interrupted = calls = 0
    while calls < 300:
        try:
            calls += 1
            out = pfb.numpy_function(pf.briefly_double_in_place, [x, x][:1 + calls % 2],
                                     tf.float32, copy=True, executor=pool)
            assert float(out[0]) == 6.0 * (1 + calls % 2), (calls, out)
        except KeyboardInterrupt:
            interrupted += 1
    interrupts.stop()
    assert interrupted > 100, interrupted
    settled(pool)  # the state every call leaves in the end, or the script's timeout
    for _ in range(8):
        out = pfb.numpy_function(pf.briefly_double_in_place, [x], tf.float32, copy=True,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.full(64 << 10, 6.0))
print("done")
"""


def test_ctrl_c_at_any_moment_of_a_call_leaves_every_block_an_owner():
    run_script(_INTERRUPTED_ANYWHERE_SCRIPT)


# Ctrl-C while a call waits for its one worker, which is held, again and
# again: the interrupt lands once the call's input is placed, at any moment
# of its wait, also just before the wait blocks (the wait must look for it
# itself).
_INTERRUPTED_QUEUED_SCRIPT = r"""
import os, signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
main = threading.main_thread().ident
BLOCK = 4000  # the waiting call's input: 1000 float32, in one block
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="queued pool") as pool:
    for round in range(12):
        go = f"{sys.argv[1]}-{round}"
        holder = threading.Thread(target=pfb.numpy_function,
                                  args=(pf.wait_for_file, [tf.constant(go)], tf.int64),
                                  kwargs={"executor": pool})
        holder.start()
        while pool.free_input_bytes == pool.arena_bytes:  # the holder's input is placed
            time.sleep(0.01)
        held = pool.free_input_bytes
        def interrupt_once_queued():
            while pool.free_input_bytes > held - BLOCK:  # the call's input is placed
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)
        interrupter = threading.Thread(target=interrupt_once_queued)
        interrupter.start()
        try:
            pfb.numpy_function(pf.double, [tf.fill([1000], 1.0)], tf.float32, executor=pool)
            raise AssertionError("not interrupted")
        except KeyboardInterrupt:
            pass
        interrupter.join()
        open(go, "w").close()
        holder.join()
        # The abandoned call's input block went back (at once, or once its
        # worker ran it), and its result's too: nothing is held for good.
        while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
            time.sleep(0.01)
    out = pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32, executor=pool)
    np.testing.assert_array_equal(out.numpy(), np.full(1000, 4.0))
print("done")
"""


def test_a_call_interrupted_while_queued_leaves_the_queue_with_its_blocks(tmp_path):
    run_script(_INTERRUPTED_QUEUED_SCRIPT, str(tmp_path / "go"))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_ctrl_c_leaves_a_calls_blocks_with_its_worker_until_it_is_done(framework):
    if framework == "torch":
        pytest.importorskip("torch")
    run_script(_INTERRUPTED_SCRIPT.format(framework=framework))


# ------------------------------------------------------------ copy=False --

F32, C64 = tf.float32, tf.complex64


@pytest.mark.parametrize("func, framework, tout, refused", [
    (pf.fresh, "numpy", F32, None),
    (pf.strided, "numpy", F32, "non_contiguous"),
    (pf.transposed, "numpy", F32, "non_contiguous"),
    (pf.fortran_order, "numpy", F32, "non_contiguous"),
    (pf.unaligned, "numpy", F32, "unaligned"),
    (pf.empty_transposed, "numpy", F32, None),
    (pf.input_itself, "numpy", F32, None),
    (pf.input_rows, "numpy", F32, "non_contiguous"),
    (pf.shared_array, "numpy", F32, "aliasing"),
    (pf.view_of_shared, "numpy", F32, "aliasing"),
    (pf.second_strided, "numpy", [F32, F32], "non_contiguous"),
    (pf.strided_of_another_dtype, "numpy", F32, "dtype"),
    (pf.strided, "torch", F32, "non_contiguous"),
    (pf.torch_fresh, "torch", F32, None),
    (pf.torch_transposed, "torch", F32, "non_contiguous"),
    (pf.input_itself, "torch", F32, None),
    (pf.torch_input_rows, "torch", F32, "non_contiguous"),
    (pf.torch_view_of_fresh, "torch", F32, "aliasing"),
    (pf.torch_conjugate, "torch", C64, "lazy"),
    (pf.torch_as_numpy, "torch", F32, "aliasing"),
], ids=lambda v: getattr(v, "__name__", None))
def test_copy_false_refuses_in_a_pool_what_it_refuses_in_process(pool, func, framework,
                                                                 tout, refused):
    """In-process pfb is the oracle: the same results are refused, with the
    same error class and message; copy=None takes them all alike."""
    x = tf.reshape(tf.range(12.0), [3, 4])

    def outcome(executor, copy):
        try:
            out = _apply(func, [x], tout, framework, executor, copy)
        except tf.errors.OpError as exc:
            return type(exc), exc.message
        return "ok", [o.numpy().tolist() for o in (out if isinstance(out, list) else [out])]

    expected = outcome(None, False)
    assert (expected[0] == "ok") == (refused is None), expected
    if refused not in (None, "dtype"):
        assert "copy=False forbids copies" in expected[1]
    assert outcome(pool, False) == expected
    assert outcome(pool, None) == outcome(None, None)


@pytest.mark.parametrize("func, refused", [(pf.large_fresh, False),
                                           (pf.large_transposed, True)])
def test_copy_false_judges_pickled_results_by_what_the_function_returned(func, refused):
    """A result too large for the arena travels pickled; the array unpickled
    here may be unaligned: that copy is the transport's, not a refusal."""
    def outcome(executor):
        try:
            return "ok", pfb.numpy_function(func, [tf.constant(0.0)], tf.float32,
                                            executor=executor, copy=False).numpy().tolist()
        except tf.errors.InvalidArgumentError as exc:
            return type(exc), exc.message
    with pfb.ProcessPool(1, arena_bytes=4096, name="small copy pool") as small:
        for _ in range(4):  # unpickled arrays land at various addresses
            assert outcome(small) == outcome(None)
    assert (outcome(None)[0] != "ok") == refused


# ----------------------------------------------------------- data movement --

def test_statistics_count_the_bytes_moved_to_and_from_workers(pool):
    previous = pfb.enable_stats(True)
    pfb.reset_stats()
    try:
        pfb.numpy_function(pf.double, [tf.zeros([1024], tf.float32)], tf.float32,
                           executor=pool, name="to a worker")
        entry = pfb.stats().functions["to a worker"]
    finally:
        pfb.enable_stats(previous)
    assert entry.calls == 1
    assert entry.bytes_copied["worker"] == 2 * 4096  # one copy in, one copy out
    assert entry.bytes_zero_copy == 4096  # the result block, handed to TF as it is


def test_tout_checks_and_the_copy_policy_are_unchanged(pool):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0: Tout declares float32 but the function returned "
                             "an array of dtype float64"):
        pfb.numpy_function(pf.float64_array, [tf.constant([1.0])], tf.float32,
                           executor=pool)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"output 1: Tout declares shape \(3,\)"):
        pfb.numpy_function(pf.two_results, [tf.constant([1, 2])],
                           [tf.int32, tf.TensorSpec([3], tf.int32)], executor=pool)
    with pytest.raises(tf.errors.InvalidArgumentError, match="returned 2 value"):
        pfb.numpy_function(pf.two_results, [tf.constant([1])], tf.int32, executor=pool)


# ------------------------------------------------------------------ errors --

@pytest.mark.parametrize("func, index", [(pf.returns_a_lambda, 0),
                                         (pf.returns_an_array_and_a_lambda, 1)])
def test_a_result_that_does_not_pickle_fails_its_call_only(func, index):
    with pfb.ProcessPool(1, name="pickle pool") as one:
        before = one.pids()
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"result {index} of the function \\(a function\\) cannot be "
                                 f"sent back from the worker process"):
            pfb.numpy_function(func, [tf.constant([1, 2])], [tf.int32] * (index + 1),
                               executor=one)
        assert one.pids() == before  # the worker lives on
        y = pfb.numpy_function(pf.double, [tf.constant([1, 2])], tf.int32, executor=one)
        assert y.numpy().tolist() == [2, 4]


# Hangs (in a subprocess, then) where the reader thread dies on the reply.
_UNLOADABLE_REPLY_SCRIPT = r"""
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, name="unloadable pool") as pool:
    try:
        pfb.numpy_function(pf.returns_what_does_not_load, [tf.constant(1)], tf.int32,
                           executor=pool)
    except tf.errors.UnknownError as exc:
        message = str(exc)
    else:
        raise AssertionError("no error")
    assert "of unloadable pool sent a reply this process cannot unpickle" in message, message
    assert "RuntimeError: this value does not load in the parent" in message, message
    assert int(pfb.numpy_function(pf.double, [tf.constant(2)], tf.int32, executor=pool)) == 4
print("done")
"""


def test_a_reply_this_process_cannot_load_fails_the_call_and_the_pool_recovers():
    run_script(_UNLOADABLE_REPLY_SCRIPT)


@pytest.mark.parametrize("func, tf_error, name, marker", [
    (pf.raises_value_error, tf.errors.InvalidArgumentError, "ValueError",
     "bad value from the worker"),
    (pf.raises_key_error, tf.errors.UnknownError, "KeyError", "missing key in the worker"),
    (pf.raises_unpicklable, tf.errors.UnknownError, "Unpicklable", "one and two"),
])
def test_exceptions_map_to_tf_errors_with_the_worker_traceback(pool, func, tf_error, name,
                                                               marker):
    run = tf.function(lambda x: pfb.numpy_function(func, [x], tf.int64, executor=pool))
    with pytest.raises(tf_error) as info:
        run(tf.constant(1, tf.int64))
    message = info.value.message
    assert marker in message and name in message
    assert "the traceback in the worker process" in message
    assert "process_functions.py" in message and f"in {func.__name__}" in message


def _autograph_map(executor, offset):
    """A map function whose functions are defined inside it: tf.data
    converts them with autograph (a nested def with a default and a branch,
    and lambdas, one closing over `offset`)."""
    def map_fn(i):
        def inner(a, k=3.0):
            if a > 1:
                return np.sqrt(a) + offset
            return a * k
        y = pfb.numpy_function(inner, [tf.cast(i, tf.float64)], tf.float64, executor=executor)
        z = pfb.numpy_function(lambda b: np.abs(b) + offset, [y], tf.float64,
                               executor=executor)
        return pfb.numpy_function(lambda a: np.sqrt(a), [z], tf.float64, executor=executor)
    return map_fn


def test_functions_autograph_converted_run_in_a_worker_as_written():
    """tf.data converts the map function, and every function defined inside
    it, with autograph: the worker receives the functions as written (the
    converted ones name TensorFlow's autograph, which a worker has not)."""
    with pfb.ProcessPool(1, name="autograph pool") as one:
        in_process = tf.data.Dataset.range(6).map(_autograph_map(None, 2.0))
        in_worker = tf.data.Dataset.range(6).map(_autograph_map(one, 2.0))
        np.testing.assert_array_equal(list(in_worker.as_numpy_iterator()),
                                      list(in_process.as_numpy_iterator()))
        # The example: an inline lambda that calls something.
        dataset = tf.data.Dataset.range(4).map(lambda i: pfb.numpy_function(
            lambda a: np.sqrt(a), [tf.cast(i, tf.float64)], tf.float64, executor=one))
        np.testing.assert_array_equal(list(dataset.as_numpy_iterator()), np.sqrt(np.arange(4)))
        # An error's traceback names this file, not autograph's generated one.
        failing = tf.data.Dataset.range(1).map(lambda i: pfb.numpy_function(
            lambda a: np.asarray(int("not a number")), [i], tf.int64, executor=one))
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            list(failing)
        message = info.value.message  # whole, where an assertion fails (pytest would elide it)
        assert "test_process_pool.py" in message, message
        assert "__autograph_generated" not in message, message
        assert not pfb.numpy_function(pf.tensorflow_imported, [0], tf.bool, executor=one)


def test_py_function_refuses_an_executor(pool):
    for executor in (pool, "process"):
        with pytest.raises(ValueError, match="py_function takes no executor.*EagerTensors"):
            pfb.py_function(pf.identity, [tf.constant(1)], tf.int32, executor=executor)


@pytest.mark.parametrize("executor", ["threads", 2, object()])
def test_executor_arguments_are_checked(executor):
    with pytest.raises(ValueError, match="executor must be None.*ProcessPool"):
        pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=executor)


def test_a_closed_pool_is_refused():
    closed = pfb.ProcessPool(1, name="closed pool")
    closed.close()
    closed.close()  # idempotent
    with pytest.raises(ValueError, match="'closed pool'.*is closed"):
        pfb.array_function(pf.identity, [tf.constant(1)], tf.int32, framework="numpy",
                           executor=closed)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0}, "workers must be a positive int"),
    ({"workers": "2"}, "workers must be a positive int"),
    ({"arena_bytes": -1}, "arena_bytes must be a non-negative int"),
])
def test_pool_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pfb.ProcessPool(**kwargs)


def test_a_graph_op_whose_pool_closed_fails_clearly():
    closing = pfb.ProcessPool(1, name="closing pool")
    run = tf.function(lambda x: pfb.numpy_function(pf.identity, [x], tf.int32,
                                                   executor=closing))
    assert int(run(tf.constant(4))) == 4
    closing.close()
    with pytest.raises(tf.errors.UnknownError, match="'closing pool' is closed|closing pool is"):
        run(tf.constant(4))


# ------------------------------------------------------------------ faults --

def _call_in_thread(func, value, executor):
    box = {}

    def call():
        try:
            box["result"] = pfb.numpy_function(func, [tf.constant(value)], tf.int64,
                                               executor=executor)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc
    thread = threading.Thread(target=call)
    thread.start()
    return thread, box


def test_a_killed_worker_fails_its_call_and_the_pool_recovers(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("PFB_TEST_MARKS", str(marks))  # the workers inherit it
    with pfb.ProcessPool(2, name="fault pool") as faulty:
        thread, box = _call_in_thread(pf.hang, 30.0, faulty)
        # Killed once the call runs (one it had not started would run in the
        # other worker: tests/pool/test_pool_resend.py).
        wait_for(lambda: len(os.listdir(marks)) == 1, seconds=30)
        victim = int(os.listdir(marks)[0])
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


def test_quick_calls_never_wait_behind_a_stuck_worker(tmp_path, monkeypatch):
    """With one of two workers stuck in a function, many quick calls at once
    all run in the free one: none is queued behind the stuck call."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("PFB_TEST_MARKS", str(marks))  # the workers inherit it
    with pfb.ProcessPool(2, name="stuck pool") as stuck:
        hung, hung_box = _call_in_thread(pf.hang, 120.0, stuck)
        wait_for(lambda: len(os.listdir(marks)) == 1, seconds=30)
        stuck_pid = int(os.listdir(marks)[0])
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
    assert isinstance(hung_box["error"], tf.errors.UnknownError)
    assert "stuck pool" in str(hung_box["error"]) and "closed" in str(hung_box["error"])


def _sockets():
    """This process's open socket descriptors."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.add(fd)
        except OSError:
            continue  # the descriptor listdir itself used
    return found


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
    sockets = _sockets()
    try:
        with pytest.raises(OSError, match="the hello could not be sent") as info:
            pfb.ProcessPool(1, name="hello pool", timeout=timeout)
        # (`info` holds the traceback, and with it the frames of the failed start.)
        assert info.value is not None and len(started) == 1
        assert started[0].poll() is not None  # ended and reaped
        assert not _alive(started[0].pid)
        assert _sockets() <= sockets  # (one of an earlier test may have closed since)
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
    monkeypatch.setattr(_process, "_RETRY_SECONDS", 1.0, raising=False)
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
    def run_frames():
        return [o for o in gc.garbage if inspect.isframe(o)
                and o.f_code is _process.ProcessPool.run.__code__]

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

# ---------------------------------------------------------------- timeouts --

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
    wait_for(lambda: not _alive(killed))
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
            made = _call_in_thread(call, arg, pool)
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
            assert "error" not in box, box["error"]
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


# ---------------------------------------------------------------- lifetime --

_EXIT_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile, threading, time
    sys.path.insert(0, {tests!r})
    folder = tempfile.TemporaryDirectory()  # (removed at exit)
    marks = os.environ["PFB_TEST_MARKS"] = folder.name  # the workers inherit it
    import tensorflow as tf
    import pyfunc_bridge as pfb
    import process_functions as pf
    how = sys.argv[1]
    executor = "process" if how.startswith("default") else pfb.ProcessPool(2)
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=executor)
    from pyfunc_bridge.pool import process_pool as _process
    pool = _process.default_pool() if executor == "process" else executor
    print(json.dumps(pool.pids()), flush=True)
    if how == "default in flight":
        for _ in range(2):  # calls that still wait at exit
            threading.Thread(target=pfb.numpy_function, daemon=True,
                             args=(pf.hang, [tf.constant(60.0)], tf.int64),
                             kwargs={{"executor": "process"}}).start()
        while len(os.listdir(marks)) < min(2, len(pool.pids())):  # in their workers
            time.sleep(0.01)
    if how == "unhandled":
        raise RuntimeError("unhandled in the main program")
    if how == "killed":
        print("ready", flush=True)
        time.sleep(60)
""")


def _shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _alive(pid):
    """Whether `pid` is still one of our worker processes (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"_worker.py" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("how, code", [("normal", 0), ("unhandled", 1),
                                       ("default", 0), ("default in flight", 0)])
def test_exit_leaves_no_worker_and_no_shared_memory(tmp_path, how, code):
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_SCRIPT.format(tests=TESTS))
    before = _shm()
    run = subprocess.run([sys.executable, str(script), how], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == code, run.stderr[-3000:]
    pids = json.loads(run.stdout.splitlines()[0])
    assert len(pids) >= 1
    assert not [p for p in pids if _alive(p)]
    assert _shm() - before == set()
    if how == "unhandled":
        assert "unhandled in the main program" in run.stderr
    else:
        assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_workers_end_when_their_parent_is_killed(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(_EXIT_SCRIPT.format(tests=TESTS))
    proc = subprocess.Popen([sys.executable, str(script), "killed"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
        assert all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not [p for p in pids if _alive(p)], seconds=20)


# Two workers stuck in functions (one asleep, one looping in Python), then
# the parent dies as the test says: killed (by the test) or os._exit.
_BUSY_PARENT_SCRIPT = r"""
import json, os, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
pool = pfb.ProcessPool(2)
for func in (pf.hang, pf.spin):
    threading.Thread(target=pfb.numpy_function, daemon=True,
                     args=(func, [tf.constant(600.0)], tf.int64),
                     kwargs={"executor": pool}).start()
marks = os.environ["PFB_TEST_MARKS"]
while len(os.listdir(marks)) < 2:  # both workers are inside their functions
    time.sleep(0.01)
print(json.dumps(pool.pids()), flush=True)
if sys.argv[1] == "exit":
    sys.stdin.readline()  # the test has seen the workers alive
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "exit"])
def test_busy_workers_end_within_seconds_when_their_parent_dies(tmp_path, how):
    """A worker inside a function (asleep, or holding its GIL) cannot read the
    end of its socket: it dies with its parent all the same (PR_SET_PDEATHSIG)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BUSY_PARENT_SCRIPT, how], cwd=TESTS,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=script_env(ROOT, TESTS, PFB_TEST_MARKS=str(marks)))
    pids = []
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        if how == "exit":
            proc.stdin.write("exit now\n")
            proc.stdin.flush()
        else:
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=30)
        wait_for(lambda: not [p for p in pids if _alive(p)], seconds=2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for p in pids:  # what outlived the parent (the failure this tests)
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_workers_outlive_the_thread_that_started_them():
    """The kernel's death signal follows the thread that started a worker:
    workers started by a thread that ends (a tf.data thread, the reader
    thread that replaces a dead worker) live on."""
    box = {}

    def start():
        box["pool"] = pfb.ProcessPool(1)
        # A call: the worker has asked for its death signal before this thread ends.
        box["pid"] = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                            executor=box["pool"]))
    starter = threading.Thread(target=start)
    starter.start()
    starter.join(timeout=60)
    with box["pool"] as pool:
        first = pool.pids()
        assert first == [box["pid"]]
        time.sleep(0.5)  # a death signal would have killed the worker by now
        assert pool.pids() == first and _alive(first[0])
        os.kill(first[0], signal.SIGKILL)  # its reader thread starts the next one, and ends
        wait_for(lambda: pool.pids() and pool.pids() != first)
        time.sleep(0.5)
        assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                      executor=pool)) == pool.pids()[0]


# A fork of a process that has pools: the child gets a clear error for the
# parent's pool and a fresh default pool, runs its exit hooks, and the
# parent's pools go on with the same workers.
_FORK_SCRIPT = r"""
import json, os, signal, sys, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool import process_pool as _process

def run(executor):
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=executor))

pool = pfb.ProcessPool(1, name="forked pool", timeout=60)
before = {"pool": pool.pids(), "default": _process.default_pool().pids(),
          "calls": [run(pool), run("process")]}
child = os.fork()
if child == 0:
    report = {}
    for how in ("api", "run"):
        try:
            if how == "api":
                run(pool)
            else:  # a graph built before the fork reaches the pool itself
                pool.ring_call(pf.pid, None, (np.int64(0),), False, False)
        except Exception as exc:  # noqa: BLE001 - reported
            report[how] = f"{type(exc).__name__}: {exc}"
    report["default"] = run("process")
    report["default_pids"] = _process.default_pool().pids()
    print("child " + json.dumps(report), flush=True)
    # The exit hooks close this process's pools (and must not touch the
    # parent's).  Then os._exit: TensorFlow's own finalization hangs in a
    # fork of a process that ran an eager op (tf.numpy_function's too).
    import atexit
    atexit._run_exitfuncs()
    os._exit(0)
deadline = time.monotonic() + 60
while os.waitpid(child, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        print("child hung", flush=True)
        break
    time.sleep(0.05)
time.sleep(0.5)  # what the child's exit did to the parent's workers is done
after = {"pool": pool.pids(), "default": _process.default_pool().pids(),
         "calls": [run(pool), run("process")]}
print("parent " + json.dumps({"before": before, "after": after}), flush=True)
"""


def test_a_forked_child_gets_a_clear_error_and_the_parent_pool_is_unaffected():
    run = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], cwd=TESTS, capture_output=True,
                         text=True, timeout=240,
                         env=script_env(ROOT, TESTS))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "child hung" not in run.stdout  # on the parent's pool
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    child = json.loads(lines["child"])
    parent = json.loads(lines["parent"])
    for how, error in (("api", child["api"]), ("run", child["run"])):
        assert "'forked pool'" in error or "forked pool " in error, (how, error)
        assert "is a fork of it" in error and "Start a ProcessPool in this process" in error
    assert child["api"].startswith("ValueError") and child["run"].startswith("PoolClosedError")
    # The child's default pool is its own; the parent's workers are the same ones.
    assert child["default"] in child["default_pids"]
    assert not set(child["default_pids"]) & set(parent["before"]["default"])
    # The same workers, and each call ran in one of its pool's (which of the
    # default pool's two takes a call is the pool's choice).
    for state in (parent["before"], parent["after"]):
        assert state["calls"][0] in state["pool"] and state["calls"][1] in state["default"]
    assert {k: parent["after"][k] for k in ("pool", "default")} == \
        {k: parent["before"][k] for k in ("pool", "default")}
    assert not [p for p in child["default_pids"] if _alive(p)]  # ended at the child's exit


# A forked child lets go of its parent's pools' shared memory: it holds no
# descriptor of their memfds and maps none of them (their mappings are its
# own memory now), the result tensors it inherited (from the Python path
# and from a kernel's native route) keep their values while the parent
# lets go of their blocks and the worker reuses them, and using the pool
# there is a clear error.
_FORK_KEEPS_RESULT_SCRIPT = r"""
import json, os, signal, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
NAME = "fork result pool"

def shared():
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/memfd:{NAME}"):
            fds.append(target)
    with open("/proc/self/maps") as f:
        return fds, [line.strip() for line in f if f"/memfd:{NAME}" in line]

with pfb.ProcessPool(1, name=NAME) as pool:
    graph = tf.function(lambda x: pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32,
                                                     executor=pool))
    graph(tf.constant(0.0))  # the kernel's first call sets up its route
    eager = pfb.numpy_function(pf.quarter_mib_of, [tf.constant(1.0)], tf.float32,
                               executor=pool)
    native = graph(tf.constant(2.0))
    addresses = {pfb.to_numpy(eager).ctypes.data, pfb.to_numpy(native).ctypes.data}
    x = tf.constant(3.0)
    fds, maps = shared()
    assert fds and maps, (fds, maps)  # (the probe sees them)
    go_r, go_w = os.pipe()
    seen_r, seen_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(go_r, 1)  # the parent let go of the blocks, and the worker reused them
        report = {"values": [float(v) for t in (eager, native)
                             for v in (pfb.to_numpy(t)[0], pfb.to_numpy(t)[-1])]}
        report["fds"], report["maps"] = shared()
        try:
            pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32, executor=pool)
        except ValueError as exc:
            report["error"] = str(exc)
        os.write(seen_w, json.dumps(report).encode())
        os._exit(0)  # (TensorFlow's own exit hangs in a fork of a process that ran ops)
    del eager, native
    later = [pfb.numpy_function(pf.quarter_mib_of, [tf.constant(7.0)], tf.float32,
                                executor=pool) for _ in range(2)]
    later += [graph(tf.constant(7.0)) for _ in range(2)]
    reused = addresses & {pfb.to_numpy(t).ctypes.data for t in later}
    os.write(go_w, b"x")
    report = json.loads(os.read(seen_r, 1 << 16).decode())
    deadline = time.monotonic() + 60
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the child hung"
        time.sleep(0.01)
    assert report["values"] == [1.0, 1.0, 2.0, 2.0], (report, reused)
    assert report["fds"] == [] and report["maps"] == [], report
    error = report.get("error", "")
    assert f"'{NAME}'" in error and "is a fork of it" in error and \
        "Start a ProcessPool in this process" in error, report
    assert [float(t[0]) for t in later] == [7.0] * 4
print("done")
"""


def test_a_forked_child_lets_go_of_the_pool_s_memory_and_keeps_its_results():
    run_script(_FORK_KEEPS_RESULT_SCRIPT)


# A pool that its user drops without close() (executor=pfb.ProcessPool()
# inline) is collected, and its collection ends its workers and reader
# threads.  Waits for states, by pid, with the script's timeout.
_DROPPED_POOL_SCRIPT = r"""
import gc, threading, time, weakref
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

def alive(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"_worker.py" in f.read()
    except OSError:
        return False

def until(condition, what):
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)

pool = pfb.ProcessPool(2, name="dropped pool")
# Both paths: an eager call (Python's), a tf.data map (the kernel's rings).
pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
ds = tf.data.Dataset.range(20).map(
    lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool))
assert list(ds.as_numpy_iterator()) == list(range(1, 21))
pids = pool.pids()
ref = weakref.ref(pool)
del pool, ds
gc.collect()
assert ref() is None, gc.get_referrers(ref())
until(lambda: not [p for p in pids if alive(p)], f"workers {pids} of a dropped pool still run")
until(lambda: not [t for t in threading.enumerate() if t.name.startswith("dropped pool")],
      "the dropped pool's threads still run")
print("done")
"""


def test_a_pool_dropped_without_close_is_collected_and_ends_its_workers():
    run_script(_DROPPED_POOL_SCRIPT)

def test_workers_do_not_import_tensorflow(pool):
    for worker_pid in pool.pids():
        with open(f"/proc/{worker_pid}/maps") as f:
            maps = f.read()
        assert "_pywrap_tensorflow" not in maps and "libtensorflow" not in maps


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_workers_run_as_batch_processes(pool):
    """A worker must not preempt the parent thread that wakes it (that thread
    may hold the GIL): workers run under SCHED_BATCH; the parent does not."""
    pid = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))
    assert pid in pool.pids()
    assert os.sched_getscheduler(pid) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def _memfds(name):
    """This process's open descriptors and mappings of the memfds whose names
    start with `name` (a pool's shared memory never shows in /dev/shm)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        if target.startswith(f"/memfd:{name}"):
            fds.append(target)
    with open("/proc/self/maps") as f:
        maps = [line for line in f if f"/memfd:{name}" in line]
    return fds, maps


def test_a_closed_pool_leaves_no_shared_memory_in_this_process():
    name = "memfd check pool"
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name=name) as pool:
        out = pfb.numpy_function(pf.identity, [tf.range(1000.0)], tf.float32, executor=pool)
        fds, maps = _memfds(name)
        # (control: each worker's rings, src/pool/shm_layout.h)
        assert fds and {"inputs", "results", "control"} == {m.split("-")[-1].split()[0]
                                                            for m in maps}
        assert int(out[999]) == 999
    # The result tensor still holds its block: the results mapping outlives close().
    assert any("-results" in m for m in _memfds(name)[1])
    assert int(out[999]) == 999
    del out, pool
    gc.collect()
    assert _memfds(name) == ([], [])


def test_close_unmaps_the_shared_memory_of_a_pool_still_referenced():
    """close() frees the arenas although the pool object lives on; a result
    tensor keeps only its own worker's mapping, until it goes."""
    name = "unmap check pool"
    sockets = _sockets()
    pool = pfb.ProcessPool(2, arena_bytes=1 << 20, name=name)
    try:
        kept = pfb.numpy_function(pf.identity, [tf.range(1000.0)], tf.float32,
                                  executor=pool)
        # The input arena, two result arenas and two control segments (each
        # mmap object holds a descriptor of its own, and the pool the input
        # arena's), and the native dispatcher's own mappings of the three
        # arenas (src/pool/dispatch.h: they outlive Python's while a kernel
        # or a tensor needs them).
        wait_for(lambda: len(_memfds(name)[1]) == 8)  # both workers attached
        fds, maps = _memfds(name)
        assert len(fds) == 6 and len(maps) == 8, (fds, maps)
    finally:
        pool.close()
    fds, maps = _memfds(name)
    # The dispatcher's mapping of the result's arena (no descriptor).
    assert fds == [] and len(maps) == 1 and "-results" in maps[0], (fds, maps)
    assert int(kept[999]) == 999
    del kept  # (no gc.collect: nothing waits for a collection)
    assert _memfds(name) == ([], [])
    assert _sockets() <= sockets  # the workers' sockets closed too


def _open_fds():
    """This process's descriptors of sockets and memfds."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("socket:", "/memfd:")):
            found.append(target)
    return found


# With gc off, in a fresh interpreter: what a dead worker leaves must go when
# its death is handled, not when a collection finds it.
_DEATHS_SCRIPT = r"""
import gc, os, signal, time
gc.disable()
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
import test_process_pool as t
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="dying pool") as pool:
    def call():
        return float(pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32,
                                        executor=pool)[0])
    assert call() == 4.0
    fds, maps = len(t._open_fds()), len(t._memfds("dying pool")[1])
    for _ in range(10):
        (victim,) = pool.pids()
        os.kill(victim, signal.SIGKILL)
        t.wait_for(lambda: pool.pids() not in ([], [victim]))  # replaced
        assert call() == 4.0  # (waits for the new worker to be ready)
    t.wait_for(lambda: len(t._open_fds()) == fds)
    assert len(t._memfds("dying pool")[1]) == maps, (t._memfds("dying pool")[1], maps)
print("done")
"""


def test_a_dead_workers_socket_and_mapping_are_closed_when_its_death_is_handled():
    run_script(_DEATHS_SCRIPT)


_ROUND_TRIP_SCRIPT = r"""
import gc, os
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))

with pfb.ProcessPool(1, name="round trip pool") as pool:  # 64 MiB arenas: 200 MiB is pickled
    (pid,) = pool.pids()
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=pool)
    x = tf.fill([50 << 20], 1.0)  # 200 MiB
    before = rss_mib(pid), rss_mib(os.getpid())
    for _ in range(2):
        out = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool)
        assert float(out[-1]) == 2.0
        del out
    after = rss_mib(pid), rss_mib(os.getpid())
    # Nothing of 200 MiB frames stays: no buffer, no reply kept.
    assert after[0] < before[0] + 32 and after[1] < before[1] + 64, (before, after)
print("done")
"""


def test_a_large_round_trip_leaves_no_large_buffer_behind():
    run_script(_ROUND_TRIP_SCRIPT)


def test_frames_larger_than_the_reader_buffer_arrive_whole():
    """FrameReader: small frames share its buffer, a large one gets its own,
    in any split of the stream."""
    import pickle
    from pyfunc_bridge.worker import frames as _worker
    a, b = socket.socketpair()
    b.settimeout(20)  # a frame that never completes fails the test
    try:
        reader = _worker.FrameReader(b, size=64)
        sent = [b"x" * 10, b"y" * 1000, b"z" * 20, list(range(300)), b"w"]
        writer = threading.Thread(target=lambda: [_worker.send(a, pickle.dumps(item))
                                                  for item in sent])
        writer.start()
        got = []
        while len(got) < len(sent):
            got.extend(reader.read(pickle.loads))
        writer.join()
        assert got == sent  # (no large buffer stays: the large round trip test)
        a.close()
        assert reader.read(pickle.loads) == []
    finally:
        a.close()
        b.close()
