"""Process workers (executor=): the results of calls in a pool equal
in-process ones, for every API, framework, result kind and payload size, and
the workers are processes of their own."""
import gc
import os
import re
import threading

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import in_arena, without_op_label
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import process_pool as _process
from process_pool_helpers import run_script
from process_pool_helpers import pool  # noqa: F401 (fixtures)


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

@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ["complex32", "float8_e4m3fn"])
def test_a_torch_result_of_a_dtype_the_bridge_cannot_take_names_it(pool, torch, dtype):
    """As in-process (tests/api/test_api_array_function.py): the output, the
    dtype and the fix, not torch's own words alone."""
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"output 0: the function returned a Tensor of dtype "
                             rf"torch\.{dtype}, which pyfunc_bridge cannot hand to "
                             rf"TensorFlow .*; convert the result to its declared Tout"):
        pfb.array_function(pf.torch_zeros_of, [tf.constant(3), tf.constant(dtype)],
                           tf.complex64, framework="torch", executor=pool)


@pytest.mark.parametrize("shape", [[1000], [0]])
def test_a_torch_function_that_writes_its_input_fails_as_in_process(pool, shape, torch):
    """Under copy=False a torch input is TensorFlow's memory in-process, and
    a write to it fails the call; in a worker the block is the call's own,
    but the function is as wrong.  Under the default both may write."""
    for executor in (None, pool):
        with pytest.raises(tf.errors.InvalidArgumentError, match="wrote to input 0 in place"):
            pfb.array_function(pf.briefly_double_in_place, [tf.ones(shape)], tf.float32,
                               framework="torch", executor=executor, copy=False)
        x = tf.ones(shape)
        got = pfb.array_function(pf.briefly_double_in_place, [x], tf.float32,
                                 framework="torch", executor=executor)
        np.testing.assert_array_equal(got.numpy(), np.full(shape, 2.0, np.float32))
        np.testing.assert_array_equal(x.numpy(), np.ones(shape, np.float32))

@pytest.mark.parametrize("func, args, tout", [
    (pf.device_result, [tf.constant(1.0)], tf.float32),    # device memory on a CPU op
    (pf.torch_bits16, [tf.constant(1)], tf.int16),         # the adapter's export refuses it
    (pf.torch_requires_grad, [tf.constant(10)], tf.float32),  # torch's own export refuses it
], ids=lambda v: getattr(v, "__name__", None))
def test_a_framework_result_is_refused_with_the_in_process_text(pool, torch, func, args, tout):
    """One rule turns a framework's result into what crosses, in-process and
    in a worker (_frameworks.py's resolved and result_capsule): the same
    refusal and text.  The worker does not know Tout's dtype, which the
    parent's text names."""
    def text(executor):
        with pytest.raises(tf.errors.OpError) as raised:
            pfb.array_function(func, args, tout, framework="torch", executor=executor)
        first = without_op_label(raised.value.message).partition("\n")[0]
        return first.partition(": ")[2]  # after "pyfunc_bridge" or the exception's class
    want = re.sub(r"Tout declares (\w+): convert the result to \1",
                  "convert the result to its declared Tout", text(None))
    assert text(pool) == want


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

# Hangs (in a subprocess, then) where a call holds some of its inputs' blocks
# while it waits for room for the others.
_INPUTS_TOGETHER_SCRIPT = "pool/results_inputs_together.py"


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
