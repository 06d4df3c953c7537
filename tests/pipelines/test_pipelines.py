"""tf.data pipelines and concurrent execution of bridge ops."""
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import collect
from fresh_python import fresh_python

N = 200
IMPLS = {"pfb": pfb.numpy_function, "tf": tf.numpy_function}


def _square_mod(i):
    return (i * i + 7) % 101


def _label(i):
    return f"item-{int(i)}:".encode() + b"x" * (int(i) % 5)


def _two(i):
    return i * 2, np.float64(i) / 3


# name -> (func, Tout)
MAPS = {
    "int": (_square_mod, tf.int64),
    "string": (_label, tf.string),
    "two_outputs": (_two, [tf.int64, tf.float64]),
}


def _pipeline(api, name, num_parallel_calls, deterministic=None):
    func, Tout = MAPS[name]
    ds = tf.data.Dataset.range(N).map(
        lambda i: api(func, [i], Tout), num_parallel_calls=num_parallel_calls,
        deterministic=deterministic)
    return [tuple(np.asarray(v).item() for v in (x if isinstance(x, tuple) else (x,)))
            for x in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def reference():
    """The sequential tf.numpy_function result of each map."""
    return {name: _pipeline(tf.numpy_function, name, None) for name in MAPS}


def test_reference_is_meaningful(reference):
    assert len(reference["int"]) == N
    assert len(set(reference["int"])) > 50  # not a constant sequence
    assert reference["string"][3] == (b"item-3:xxx",)
    assert reference["two_outputs"][6] == (12, 2.0)


@pytest.mark.parametrize("num_parallel_calls", [1, 4, tf.data.AUTOTUNE],
                         ids=["1", "4", "autotune"])
@pytest.mark.parametrize("name", sorted(MAPS))
def test_map_matches_reference_in_order(reference, name, num_parallel_calls):
    assert _pipeline(pfb.numpy_function, name, num_parallel_calls) == reference[name]


@pytest.mark.parametrize("name", ["int", "two_outputs"])
def test_nondeterministic_map_gives_same_multiset(reference, name):
    got = _pipeline(pfb.numpy_function, name, 4, deterministic=False)
    assert len(got) == N
    assert sorted(got) == sorted(reference[name])


def test_stateless_op_in_map(reference):
    ds = tf.data.Dataset.range(N).map(
        lambda i: pfb.numpy_function(_square_mod, [i], tf.int64, stateful=False),
        num_parallel_calls=4)
    assert [(int(v),) for v in ds.as_numpy_iterator()] == reference["int"]


def _fails_at_57(i):
    if i == 57:
        raise ValueError(f"bad element {int(i)} in pipeline")
    return i


@pytest.mark.parametrize("num_parallel_calls", [None, 4])
def test_exception_in_map_surfaces(num_parallel_calls):
    errors = {}
    for impl, api in IMPLS.items():
        ds = tf.data.Dataset.range(N).map(lambda i: api(_fails_at_57, [i], tf.int64),
                                          num_parallel_calls=num_parallel_calls)
        seen = []
        with pytest.raises(tf.errors.OpError) as info:
            for x in ds.as_numpy_iterator():
                seen.append(int(x))
        assert seen == list(range(57))  # everything before the failure came through
        errors[impl] = info.value
    assert "bad element 57 in pipeline" in errors["pfb"].message
    assert "ValueError" in errors["pfb"].message
    assert "_fails_at_57" in errors["pfb"].message
    assert type(errors["pfb"]) is type(errors["tf"])


# --------------------------------------------------------------------------
# Ops that block on each other must run concurrently.

TIMEOUT = 10


def _handshake_funcs():
    """Op A sends, then waits for B's reply; op B waits for A, then replies."""
    to_b, to_a = queue.Queue(), queue.Queue()

    def op_a(x):
        to_b.put(int(x) + 1)
        return np.int64(to_a.get(timeout=TIMEOUT))

    def op_b(x):
        got = to_b.get(timeout=TIMEOUT)
        to_a.put(got * 100)
        return np.int64(got + int(x))

    return op_a, op_b


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("order", ["a_first", "b_first"])
def test_blocking_ops_in_one_session_run(impl, order):
    api = IMPLS[impl]
    op_a, op_b = _handshake_funcs()
    with tf.Graph().as_default():
        x = tf.constant(4, tf.int64)
        if order == "a_first":
            a = api(op_a, [x], tf.int64)
            b = api(op_b, [x], tf.int64)
        else:
            b = api(op_b, [x], tf.int64)
            a = api(op_a, [x], tf.int64)
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
        with tf.compat.v1.Session(config=config) as sess:
            got_a, got_b = sess.run([a, b])
    assert got_a == 500
    assert got_b == 9


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_blocking_ops_in_one_tf_function(impl):
    api = IMPLS[impl]
    op_a, op_b = _handshake_funcs()

    # Stateless: tf.function orders stateful ops by program order, which
    # would serialize A before B.
    @tf.function
    def f(x):
        return (api(op_a, [x], tf.int64, stateful=False),
                api(op_b, [x], tf.int64, stateful=False))

    got_a, got_b = f(tf.constant(4, tf.int64))
    assert int(got_a) == 500
    assert int(got_b) == 9


# --------------------------------------------------------------------------
# Python threads sharing one tf.function.

@tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)])
def _shared(x, k):
    y = pfb.numpy_function(lambda a, b: a * b + 1, [x, k], tf.int64)
    return y * 2


def test_threads_share_a_tf_function():
    def worker(tid):
        for n in range(200):
            x = np.arange(n % 7 + 1, dtype=np.int64) + tid * 1000
            y = _shared(tf.constant(x), tf.constant(n, tf.int64)).numpy()
            np.testing.assert_array_equal(y, (x * n + 1) * 2)
        return tid

    with ThreadPoolExecutor(4) as pool:
        done = [f.result(timeout=120) for f in [pool.submit(worker, t) for t in range(4)]]
    assert done == [0, 1, 2, 3]
    assert _shared.experimental_get_tracing_count() == 1


def test_threads_call_eagerly():
    barrier = threading.Barrier(4)

    def worker(tid):
        barrier.wait(timeout=30)
        for n in range(100):
            y = pfb.numpy_function(lambda a: a + tid, [tf.constant([n], tf.int32)], tf.int32)
            assert y.numpy().tolist() == [n + tid]
        return tid

    with ThreadPoolExecutor(4) as pool:
        done = [f.result(timeout=120) for f in [pool.submit(worker, t) for t in range(4)]]
    assert done == [0, 1, 2, 3]


# ------------------------------------------- worker threads and their state --

def _python_thread_states():
    import ctypes
    api = ctypes.pythonapi
    api.PyInterpreterState_Head.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    count, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Head())
    while ts:
        count, ts = count + 1, api.PyThreadState_Next(ts)
    return count


def _private_pool_pipelines(func, rounds):
    """Pipelines whose worker threads end with their iterator."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = 2
    for _ in range(rounds):
        ds = tf.data.Dataset.range(8).map(
            lambda x: pfb.numpy_function(func, [x], tf.int64), num_parallel_calls=2)
        for _ in ds.with_options(options).prefetch(2):
            pass
    collect()


def test_exited_worker_threads_leave_no_python_thread_state_or_thread_locals():
    scratch = threading.local()
    made = []

    def func(v):
        if getattr(scratch, "buffer", None) is None:
            scratch.buffer = Marker()
            made.append(1)
        return v + 1

    class Marker:
        alive = 0

        def __init__(self):
            Marker.alive += 1

        def __del__(self):
            Marker.alive -= 1

    _private_pool_pipelines(func, 5)
    pfb.numpy_function(lambda: 0, [], tf.int64)  # lets the bridge clean up
    before = _python_thread_states()
    _private_pool_pipelines(func, 20)
    pfb.numpy_function(lambda: 0, [], tf.int64)
    assert len(made) > 20  # new worker threads kept appearing
    assert _python_thread_states() <= before + 4
    assert Marker.alive <= 4


# ------------------------------------ tf.data's own threads, in a fresh process --

_THREAD_MAPS = "pipelines/thread_maps.py"


def test_maps_on_tf_data_threads_finish_in_every_api_and_parallelism():
    # Python 3.12+ unbinds the deleting thread's own PyGILState binding when a
    # foreign thread state is deleted: the bridge then kept the GIL for ever
    # and the first map hung, where no timeout inside the process could help.
    proc = fresh_python(_THREAD_MAPS, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    done = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("DONE")]
    assert len(done) == 12, proc.stdout



@pytest.mark.parametrize("api", ["numpy_function", "py_function"])
def test_a_python_error_another_kernel_left_on_a_tf_thread_does_not_fail_later_calls(api):
    # TF's own PyFunc kernel, given a token it cannot decode, releases the GIL
    # with a UnicodeDecodeError still set (TF's script_ops_test provokes it).
    # On a thread whose Python thread state the bridge keeps, that error
    # outlived TF's call, and the bridge's next call there was a SystemError.
    from tensorflow.python.ops import gen_script_ops
    ours = {"numpy_function": pfb.numpy_function, "py_function": pfb.py_function}[api]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        y = ours(lambda a: a + 1, [tf.constant(1)], tf.int32)
        bad = gen_script_ops.py_func(input=[tf.constant([1, 2])], token=b"\xb0",
                                     Tout=[tf.int32])
        for _ in range(20):
            assert sess.run(y) == 2
            with pytest.raises(tf.errors.InternalError):
                sess.run(bad)
        assert [sess.run(y) for _ in range(20)] == [2] * 20
