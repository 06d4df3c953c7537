"""py_function gradients in pipelines, threads and loops, and its memory bounds.

tf.py_function is not used as a reference here: its gradient state is keyed by
a per-op token and fails these cases (docs/design.md, "Measured facts")."""
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import collect


def _cube(a):
    return a * a * a


def _plain_value_and_grad(func, x, *args):
    """The same computation in plain TF (no py_function), eagerly."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = func(x, *args)
    return y, tape.gradient(y, x)


# --------------------------------------------------------------------------
# A parallel tf.data map, each element taking its own gradient.

N_ELEMENTS = 2000


def _x_of(i):
    return tf.cast(i, tf.float64) / 100.0 - 10.0


def _value_and_grad_in_map(i):
    x = _x_of(i)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(_cube, [x], tf.float64)
    return i, y, tape.gradient(y, x)


def test_parallel_map_gradients():
    ds = tf.data.Dataset.range(N_ELEMENTS).map(
        _value_and_grad_in_map, num_parallel_calls=8, deterministic=False)
    seen = set()
    x_all = _x_of(tf.range(N_ELEMENTS, dtype=tf.int64))
    want_y, want_g = _plain_value_and_grad(_cube, x_all)
    want_y, want_g, x_all = want_y.numpy(), want_g.numpy(), x_all.numpy()
    count = 0
    for i, y, g in ds.as_numpy_iterator():
        count += 1
        seen.add(int(i))
        assert y == want_y[i], i
        assert g == want_g[i], i  # exactly the plain TF gradient of this element
        assert g == pytest.approx(3 * x_all[i] ** 2, rel=1e-12), i
    assert count == N_ELEMENTS and seen == set(range(N_ELEMENTS))
    assert len(set(want_g.tolist())) > N_ELEMENTS // 2  # the gradients differ


def test_parallel_map_vector_gradients_with_two_inputs():
    # Each element: y = sum(a * b) with a, b vectors of a per-element length.
    def dot(a, b):
        return tf.reduce_sum(a * b)

    def element(i):
        n = tf.cast(i % 5 + 1, tf.int32)
        a = tf.cast(tf.range(n), tf.float32) + tf.cast(i, tf.float32)
        b = tf.cast(tf.range(n), tf.float32) * 0.5 - 1.0
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = pfb.py_function(dot, [a, b], tf.float32)
        da, db = tape.gradient(y, [a, b])
        return a, b, da, db

    ds = tf.data.Dataset.range(400).map(element, num_parallel_calls=8)
    count = 0
    for a, b, da, db in ds.as_numpy_iterator():
        count += 1
        np.testing.assert_array_equal(da, b)
        np.testing.assert_array_equal(db, a)
    assert count == 400


# --------------------------------------------------------------------------
# Python threads sharing one tf.function that takes a gradient.

@tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
def _shared_value_and_grad(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(_cube, [x], tf.float64)
    return y, tape.gradient(y, x)


def test_threads_share_a_gradient_tf_function():
    calls = 1000
    barrier = threading.Barrier(4)

    def worker(tid):
        barrier.wait(timeout=60)
        wrong = 0
        for n in range(calls):
            x = np.arange(n % 4 + 1, dtype=np.float64) + tid * 10000.0 + n + 0.25
            y, g = _shared_value_and_grad(tf.constant(x))
            # x**3 and 3*x**2 with the same float64 operations as TF's.
            if not (np.array_equal(y.numpy(), x * x * x)
                    and np.allclose(g.numpy(), 3 * x * x, rtol=1e-14, atol=0)):
                wrong += 1
        return wrong

    with ThreadPoolExecutor(4) as pool:
        wrong = [f.result(timeout=300) for f in [pool.submit(worker, t) for t in range(4)]]
    assert wrong == [0, 0, 0, 0]
    assert _shared_value_and_grad.experimental_get_tracing_count() == 1


def test_threads_take_eager_gradients():
    barrier = threading.Barrier(4)

    def worker(tid):
        barrier.wait(timeout=60)
        for n in range(100):
            x = tf.constant([tid * 100.0 + n, -n - 0.5], tf.float64)
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = pfb.py_function(_cube, [x], tf.float64)
            g = tape.gradient(y, x).numpy()
            np.testing.assert_allclose(g, 3 * x.numpy() ** 2, rtol=1e-14)
        return tid

    with ThreadPoolExecutor(4) as pool:
        done = [f.result(timeout=300) for f in [pool.submit(worker, t) for t in range(4)]]
    assert done == [0, 1, 2, 3]


# --------------------------------------------------------------------------
# Gradients through loops: each iteration's call is paired with its backward.

def _step(y, i):
    return tf.sin(y) * tf.cast(i + 1, y.dtype) + y * 0.5


_LOOP_X = tf.constant([0.3, -1.2, 2.0], tf.float64)
_STEPS = 5


def _plain_loop(x):
    y = x
    for i in range(_STEPS):
        y = _step(y, tf.constant(i))
    return y


def _py_step(y, i):
    return pfb.py_function(_step, [y, i], tf.TensorSpec([3], tf.float64))


@pytest.fixture(scope="module")
def loop_reference():
    y, g = _plain_value_and_grad(_plain_loop, _LOOP_X)
    return y.numpy(), g.numpy()


def test_gradient_inside_while_loop(loop_reference):
    @tf.function
    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            _, y = tf.while_loop(lambda i, y: i < _STEPS,
                                 lambda i, y: (i + 1, _py_step(y, i)),
                                 [tf.constant(0), x])
        return y, tape.gradient(y, x)

    y, g = f(_LOOP_X)
    np.testing.assert_allclose(y.numpy(), loop_reference[0], rtol=1e-13)
    np.testing.assert_allclose(g.numpy(), loop_reference[1], rtol=1e-13)
    assert np.abs(loop_reference[1]).min() > 1e-3  # every element's gradient matters


def test_gradient_inside_autograph_for_loop(loop_reference):
    @tf.function
    def f(x, n):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x
            for i in tf.range(n):
                y = _py_step(y, i)
        return y, tape.gradient(y, x)

    for _ in range(2):  # a second run of the same graph
        y, g = f(_LOOP_X, tf.constant(_STEPS))
        np.testing.assert_allclose(y.numpy(), loop_reference[0], rtol=1e-13)
        np.testing.assert_allclose(g.numpy(), loop_reference[1], rtol=1e-13)


def test_tf_gradients_through_while_loop_in_session(loop_reference):
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float64, [3])
        _, y = tf.while_loop(lambda i, y: i < _STEPS,
                             lambda i, y: (i + 1, _py_step(y, i)),
                             [tf.constant(0), x])
        (g,) = tf.gradients(y, x)
        with tf.compat.v1.Session() as sess:
            got_y, got_g = sess.run([y, g], {x: _LOOP_X.numpy()})
    np.testing.assert_allclose(got_y, loop_reference[0], rtol=1e-13)
    np.testing.assert_allclose(got_g, loop_reference[1], rtol=1e-13)


# --------------------------------------------------------------------------
# Memory: per-call gradient state is freed; RSS stays flat.

MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss():
    collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _double(a):
    return a * 2.0


def _growth(step, calls, warmup=200):
    for _ in range(warmup):
        step()
    base = _rss()
    for _ in range(calls):
        step()
    return _rss() - base


@pytest.fixture(scope="module")
def mib_input():
    return tf.constant(np.random.default_rng(0).random(MIB // 4, dtype=np.float32))


@pytest.mark.slow
def test_eager_calls_under_a_tape_keep_rss_flat(mib_input):
    def step():
        with tf.GradientTape() as tape:
            tape.watch(mib_input)
            y = pfb.py_function(_double, [mib_input], tf.float32)
        assert y.shape == mib_input.shape

    growth = _growth(step, 3000)
    assert growth < 50 * MIB, f"RSS grew {growth / MIB:.0f} MiB over 3000 calls"


@pytest.mark.slow
def test_eager_calls_without_a_tape_keep_rss_flat(mib_input):
    def step():
        y = pfb.py_function(_double, [mib_input], tf.float32)
        assert y.shape == mib_input.shape

    growth = _growth(step, 3000)
    assert growth < 50 * MIB, f"RSS grew {growth / MIB:.0f} MiB over 3000 calls"


@pytest.mark.slow
def test_eager_gradients_keep_rss_flat(mib_input):
    def step():
        with tf.GradientTape() as tape:
            tape.watch(mib_input)
            y = pfb.py_function(_double, [mib_input], tf.float32)
        assert tape.gradient(y, mib_input).shape == mib_input.shape

    growth = _growth(step, 300)
    assert growth < 50 * MIB, f"RSS grew {growth / MIB:.0f} MiB over 300 calls"


@pytest.mark.slow
def test_tf_function_gradients_keep_rss_flat(mib_input):
    @tf.function
    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(_double, [x], tf.float32)
        return tf.reduce_sum(y), tape.gradient(y, x)

    def step():
        _, g = value_and_grad(mib_input)
        assert g.shape == mib_input.shape

    growth = _growth(step, 1000)
    assert growth < 50 * MIB, f"RSS grew {growth / MIB:.0f} MiB over 1000 calls"
    _, g = value_and_grad(mib_input)
    np.testing.assert_array_equal(g.numpy(), np.full(g.shape, 2.0, np.float32))


@pytest.mark.slow
def test_dropped_tapes_free_their_state(mib_input):
    # Tapes kept alive hold their calls' state; dropping them frees it, so
    # rounds of 40 held tapes (40+ MiB each round) leave RSS flat.
    def held_round():
        tapes = []
        for _ in range(40):
            tape = tf.GradientTape()
            with tape:
                tape.watch(mib_input)
                pfb.py_function(_double, [mib_input], tf.float32)
            tapes.append(tape)
        assert len(tapes) == 40

    for _ in range(2):  # warm-up: the allocator's high-water mark
        held_round()
    base = _rss()
    for _ in range(6):
        held_round()
    growth = _rss() - base
    assert growth < 50 * MIB, f"RSS grew {growth / MIB:.0f} MiB over 6 rounds of held tapes"
