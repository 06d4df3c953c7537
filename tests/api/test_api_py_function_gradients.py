"""pfb.py_function's gradient: once-differentiable, against the numerical
Jacobian and tf.py_function's, in every mode; second-order gradients fail
loudly; gradient state is recorded only where a gradient can run."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import record

import pyfunc_bridge as pfb
from conftest import py_function_gradient

X = tf.constant([0.5, -1.0, 2.0, 3.0])


# --------------------------------------------------------------------------
# Gradients against the numerical Jacobian of the same function.

def _elementwise(a):
    return tf.sin(a) * a


def _matmul(a, b):
    return tf.matmul(a, b)


def _with_int(a, k):
    return a * tf.cast(k, a.dtype) ** 2 + tf.exp(a)


def _numpy_square(a):
    return a.numpy() ** 2


def _two_outputs(a):
    return tf.exp(a), a * a * a


_rng = np.random.default_rng(7)

# name -> (func, inputs, Tout, used output index or None for a single output)
GRAD_CASES = {
    "elementwise": (_elementwise, [_rng.normal(size=[5])], tf.float64, None),
    "matmul": (_matmul, [_rng.normal(size=[2, 3]), _rng.normal(size=[3, 4])], tf.float64,
               None),
    "int_input": (_with_int, [_rng.normal(size=[4]), np.array(3, np.int32)], tf.float64, None),
    "numpy_result": (_numpy_square, [_rng.normal(size=[3])], tf.float64, None),
    "one_of_two_outputs": (_two_outputs, [_rng.normal(size=[4])], [tf.float64, tf.float64], 1),
}


def _used(outputs, used):
    return outputs if used is None else outputs[used]


def _float_positions(inputs):
    return [i for i, v in enumerate(inputs) if v.dtype.kind == "f"]


def _expected_gradients(case):
    """d(sum(w * output))/d(float input), from tf.test.compute_gradient's
    numerical Jacobian; zeros where the function returns a NumPy array."""
    func, inputs, Tout, used = GRAD_CASES[case]
    positions = _float_positions(inputs)
    out = _used(pfb.py_function(func, [tf.constant(v) for v in inputs], Tout), used)
    weights = np.linspace(0.5, 1.5, out.shape.num_elements()).reshape(out.shape)
    if case == "numpy_result":  # the op's TF computation does not involve the input
        return weights, [np.zeros_like(inputs[i]) for i in positions]

    def of_floats(*floats):
        full = list(inputs)
        for i, v in zip(positions, floats):
            full[i] = v
        full = [tf.convert_to_tensor(v) for v in full]
        return _used(pfb.py_function(func, full, Tout), used)

    _, numerical = tf.test.compute_gradient(of_floats, [inputs[i] for i in positions])
    return weights, [(jac.T @ weights.ravel()).reshape(inputs[i].shape)
                     for jac, i in zip(numerical, positions)]


def _check_gradients(case, grads, weights_expected):
    weights, expected = weights_expected
    _, inputs, _, _ = GRAD_CASES[case]
    positions = _float_positions(inputs)
    for i, grad in enumerate(grads):
        if i not in positions:
            assert grad is None  # integer input
    got = [grads[i] for i in positions]
    assert all(g is not None for g in got)
    for g, want in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def expected_gradients():
    return {case: _expected_gradients(case) for case in GRAD_CASES}


def test_expected_gradients_are_meaningful(expected_gradients):
    for case, (_, expected) in expected_gradients.items():
        norm = sum(float(np.abs(e).sum()) for e in expected)
        assert (norm == 0) == (case == "numpy_result"), case


# A NumPy result is not a function of the op's TF computation: its gradient is
# zero (checked below), not its numerical derivative.
@pytest.mark.parametrize("case", sorted(set(GRAD_CASES) - {"numpy_result"}))
def test_eager_tape_full_jacobian(case):
    func, inputs, Tout, used = GRAD_CASES[case]
    positions = _float_positions(inputs)

    def of_floats(*floats):
        full = list(inputs)
        for i, v in zip(positions, floats):
            full[i] = v
        return _used(pfb.py_function(func, [tf.convert_to_tensor(v) for v in full], Tout),
                     used)

    theoretical, numerical = tf.test.compute_gradient(of_floats,
                                                      [inputs[i] for i in positions])
    for t, n in zip(theoretical, numerical):
        assert np.abs(n).sum() > 0
        np.testing.assert_allclose(t, n, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_eager_gradient_tape(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    xs = [tf.constant(v) for v in inputs]
    with tf.GradientTape() as tape:
        for x in xs:
            if x.dtype.is_floating:
                tape.watch(x)
        loss = tf.reduce_sum(_used(pfb.py_function(func, xs, Tout), used) * weights)
    grads = tape.gradient(loss, xs)
    _check_gradients(case, grads, expected_gradients[case])


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_tf_function_gradient_tape(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    positions = _float_positions(inputs)

    @tf.function
    def grads_of(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                if x.dtype.is_floating:
                    tape.watch(x)
            loss = tf.reduce_sum(_used(pfb.py_function(func, list(xs), Tout), used) * weights)
        grads = tape.gradient(loss, list(xs))
        return [g for i, g in enumerate(grads) if i in positions], [
            g is None for i, g in enumerate(grads) if i not in positions]

    got, int_none = grads_of(*[tf.constant(v) for v in inputs])
    assert all(int_none)
    full = [None] * len(inputs)
    for i, g in zip(positions, got):
        full[i] = g
    _check_gradients(case, full, expected_gradients[case])


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_session_tf_gradients(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    positions = _float_positions(inputs)
    with tf.Graph().as_default():
        xs = [tf.compat.v1.placeholder(tf.as_dtype(v.dtype), v.shape) for v in inputs]
        loss = tf.reduce_sum(_used(pfb.py_function(func, xs, Tout), used) * weights)
        grads = tf.gradients(loss, xs)
        for i, g in enumerate(grads):
            if i not in positions:
                assert g is None
        with tf.compat.v1.Session() as sess:
            feed = dict(zip(xs, inputs))
            got = sess.run([grads[i] for i in positions], feed)
            again = sess.run([grads[i] for i in positions], feed)  # one forward per run
    full = [None] * len(inputs)
    for i, g in zip(positions, got):
        full[i] = g
    _check_gradients(case, full, expected_gradients[case])
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a, b)


def test_session_gradients_follow_each_feed():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float64, [None])
        y = pfb.py_function(lambda a: a ** 3, [p], tf.float64)
        (g,) = tf.gradients(y, p)
        with tf.compat.v1.Session() as sess:
            for n in range(1, 6):
                v = np.arange(n, dtype=np.float64) - 1.5
                np.testing.assert_allclose(sess.run(g, {p: v}), 3 * v ** 2)


def test_persistent_tape_gradient_twice():
    x = tf.constant([0.3, -2.0, 1.5], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        u, v = pfb.py_function(_two_outputs, [x], [tf.float64, tf.float64])
    first = tape.gradient(v, x)
    second = tape.gradient(v, x)
    of_u = tape.gradient(u, x)
    both = tape.gradient([u, v], x)
    del tape
    np.testing.assert_allclose(first.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_array_equal(second.numpy(), first.numpy())
    np.testing.assert_allclose(of_u.numpy(), np.exp(x.numpy()))
    np.testing.assert_allclose(both.numpy(), np.exp(x.numpy()) + 3 * x.numpy() ** 2)


def test_gradient_through_a_variable():
    v = tf.Variable([1.0, -2.0, 0.5])
    with tf.GradientTape() as tape:
        y = pfb.py_function(lambda a: tf.reduce_sum(a * a), [v], tf.float32)
    np.testing.assert_allclose(tape.gradient(y, v).numpy(), 2 * v.numpy())


def test_gradient_matches_tf_py_function():
    x = tf.constant([0.2, 0.7, -1.1], tf.float64)
    grads = []
    for api in (pfb.py_function, tf.py_function):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = api(_elementwise, [x], tf.float64)
        grads.append(tape.gradient(y, x).numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_gradient_of_function_using_a_captured_variable():
    # The function's own TF computation is recorded, including its inputs only.
    w = tf.Variable(3.0, dtype=tf.float64)
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(lambda a: a * w, [x], tf.float64)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [3.0, 3.0])


# --------------------------------------------------------------------------
# Second-order gradients are not defined: they fail loudly, not with None.

def _square(a):
    return a * a


_LOUD = (LookupError, tf.errors.OpError)


def test_second_order_eager_fails_loudly():
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = pfb.py_function(_square, [x], tf.float64)
        gx = inner.gradient(y, x)
    np.testing.assert_allclose(gx.numpy(), [2.0, 4.0])  # first order works
    with pytest.raises(_LOUD, match="(?i)differentiab|gradient"):
        outer.gradient(gx, x)


def test_second_order_tf_gradients_fails_loudly():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float64, [2])
        y = pfb.py_function(_square, [p], tf.float64)
        (g,) = tf.gradients(y, p)
        with pytest.raises(_LOUD, match="(?i)differentiab|gradient"):
            tf.gradients(g, p)


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_forward_mode_matches_tf_py_function(mode):
    """tf.autodiff.ForwardAccumulator: the Jacobian-vector product, as
    TensorFlow's py_function gives it (TF's generic rule would fail on the
    op's internal output)."""
    x = tf.constant([0.5, -1.0, 2.0])
    tangent = tf.constant([1.0, 10.0, -3.0])

    def jvp(f, x):
        with tf.autodiff.ForwardAccumulator(x, tangent) as acc:
            y = f(_elementwise, [x], tf.float32)
        return acc.jvp(y)

    run = (lambda f: jvp(f, x)) if mode == "eager" else (
        lambda f: tf.function(lambda x: jvp(f, x))(x))
    got = run(pfb.py_function).numpy()
    np.testing.assert_allclose(got, run(tf.py_function).numpy(), rtol=1e-6)
    a = x.numpy()
    np.testing.assert_allclose(got, (np.cos(a) * a + np.sin(a)) * tangent.numpy(), rtol=1e-6)


def test_forward_mode_of_several_outputs_and_untracked_inputs():
    x = tf.constant([1.0, 2.0])
    with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
        scaled, doubled = pfb.py_function(
            lambda a, k: (a * tf.cast(k, tf.float32), k * 2), [x, tf.constant(3)],
            [tf.float32, tf.int32])
        untracked = pfb.py_function(_square, [tf.constant([3.0])], tf.float32)
    np.testing.assert_array_equal(acc.jvp(scaled).numpy(), [3.0, 3.0])
    assert acc.jvp(doubled) is None and acc.jvp(untracked) is None
    np.testing.assert_array_equal(untracked.numpy(), [9.0])


# --------------------------------------------------------------------------
# Gradient state is recorded only when a gradient can run.

def _recording_probe():
    flags = []

    def func(a):
        flags.append(record.could_possibly_record())
        return a * a

    return flags, func


def test_eager_without_tape_records_nothing():
    flags, func = _recording_probe()
    pfb.py_function(func, [X], tf.float32)
    assert flags == [False]


def test_eager_under_watching_tape_records():
    flags, func = _recording_probe()
    with tf.GradientTape() as tape:
        tape.watch(X)
        y = pfb.py_function(func, [X], tf.float32)
    assert flags == [True]
    np.testing.assert_allclose(tape.gradient(y, X).numpy(), 2 * X.numpy())


def test_inference_tf_function_records_nothing():
    flags, func = _recording_probe()
    f = tf.function(lambda x: pfb.py_function(func, [x], tf.float32))
    f(X)
    f(X + 1)
    assert flags == [False, False]


def test_tf_data_map_without_gradient_records_nothing():
    flags, func = _recording_probe()
    ds = tf.data.Dataset.range(3).map(
        lambda i: pfb.py_function(func, [tf.cast(i, tf.float32)], tf.float32))
    assert [float(v) for v in ds] == [0.0, 1.0, 4.0]
    assert flags == [False, False, False]


def test_tf_function_taking_gradient_records():
    flags, func = _recording_probe()
    np.testing.assert_allclose(py_function_gradient(func)(X).numpy(), 2 * X.numpy())
    assert flags == [True]


def test_session_records_only_with_gradient_wired():
    flags, func = _recording_probe()
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [None])
        y = pfb.py_function(func, [p], tf.float32)
        with tf.compat.v1.Session() as sess:
            sess.run(y, {p: [1.0]})
            (g,) = tf.gradients(y, p)
            assert sess.run(g, {p: [1.5]}).tolist() == [3.0]
    assert flags == [False, True]


# --------------------------------------------------------------------------
# tf.vectorized_map and GradientTape.jacobian, which vectorize with pfor.

def test_vectorized_map_runs_the_function_per_row_as_tf_py_function():
    rows = tf.reshape(tf.range(6, dtype=tf.float32), [3, 2])
    got = tf.vectorized_map(lambda r: pfb.py_function(lambda a: a * 2 + 1, [r], tf.float32),
                            rows)
    expected = tf.vectorized_map(
        lambda r: tf.py_function(lambda a: a * 2 + 1, [r], tf.float32), rows)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_gradient_through_vectorized_map():
    v = tf.Variable([[1.0, 2.0], [3.0, -4.0]])
    with tf.GradientTape() as tape:
        y = tf.vectorized_map(lambda r: pfb.py_function(lambda a: a * a * a, [r], tf.float32), v)
        total = tf.reduce_sum(y)
    np.testing.assert_allclose(tape.gradient(total, v).numpy(), 3 * v.numpy() ** 2)


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_jacobian_with_pfor(mode):
    x = tf.constant([0.5, -1.0, 2.0])

    def jacobian(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(_elementwise, [x], tf.float32)
        return tape.jacobian(y, x)

    got = (jacobian if mode == "eager" else tf.function(jacobian))(x)
    a = x.numpy()
    np.testing.assert_allclose(got.numpy(), np.diag(np.cos(a) * a + np.sin(a)), rtol=1e-6)
