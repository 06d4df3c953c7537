"""In-place writes to inputs (issue: drop-in for real pipelines): code written
for tf.numpy_function that normalises an image in place (``img -= mean``)
runs with pfb in every mode, with TensorFlow's values, and no write is ever
seen outside the call.  Memory the call holds alone is written where it
lives (zero-copy); memory TF shares is copied first ("shared_input").
Pools are in tests/pool/test_process_pool_inplace.py."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

VALUES = np.array([[3.0, 5.0], [7.0, 9.0]], np.float32)
EXPECTED = (VALUES - 1.0) / 2.0


def normalize(img):
    # As augmentation code writes it for tf.numpy_function.
    img -= 1.0
    img /= 2.0
    return img


def shuffle_rows(x):
    np.random.default_rng(0).shuffle(x)
    return x


@pytest.fixture(autouse=True)
def on_the_cpu():
    with tf.device("/CPU:0"):
        yield


@pytest.mark.parametrize("api", ["numpy_function", "py_func"])
def test_eager_call_writes_a_copy(api):
    x = tf.constant(VALUES)
    got = getattr(pfb, api)(normalize, [x], tf.float32)
    np.testing.assert_array_equal(got.numpy(), EXPECTED)
    np.testing.assert_array_equal(x.numpy(), VALUES)  # Python still holds it


def test_tensorflow_gives_the_expected_values_once():
    """The oracle: TF's numpy_function on a fresh tensor.  (Called again on a
    captured constant, TF's writes the constant itself in a graph and drifts:
    the silent aliasing pfb does not copy.)"""
    for f in (tf.numpy_function, tf.function(tf.numpy_function)):
        got = f(normalize, [tf.constant(VALUES)], tf.float32)
        np.testing.assert_array_equal(got.numpy(), EXPECTED)


def test_graph_calls_leave_a_captured_constant_and_an_argument_alone():
    c = tf.constant(VALUES)
    captured = tf.function(lambda: pfb.numpy_function(normalize, [c], tf.float32))
    argument = tf.function(lambda x: pfb.numpy_function(normalize, [x], tf.float32))
    for _ in range(3):  # a written constant would drift call by call
        np.testing.assert_array_equal(captured().numpy(), EXPECTED)
        np.testing.assert_array_equal(argument(c).numpy(), EXPECTED)
    np.testing.assert_array_equal(c.numpy(), VALUES)


def test_a_tensor_another_op_also_reads_is_not_written():
    @tf.function
    def f(x):
        y = x * 1.0  # two consumers: the call and the sum
        out = pfb.numpy_function(normalize, [y], tf.float32)
        with tf.control_dependencies([out]):
            return out, y + 0.0

    for _ in range(3):
        out, other = f(tf.constant(VALUES))
        np.testing.assert_array_equal(out.numpy(), EXPECTED)
        np.testing.assert_array_equal(other.numpy(), VALUES)


def test_a_slice_of_a_bigger_tensor_is_not_written():
    @tf.function
    def f(x):
        big = x * 1.0
        row = big[0]  # may share big's buffer
        out = pfb.numpy_function(normalize, [row], tf.float32)
        with tf.control_dependencies([out]):
            return out, tf.identity(big)

    out, big = f(tf.constant(VALUES))
    np.testing.assert_array_equal(out.numpy(), EXPECTED[0])
    np.testing.assert_array_equal(big.numpy(), VALUES)


def test_a_variable_is_not_written():
    v = tf.Variable(VALUES)
    f = tf.function(lambda: pfb.numpy_function(normalize, [v.read_value()], tf.float32))
    np.testing.assert_array_equal(f().numpy(), EXPECTED)
    np.testing.assert_array_equal(f().numpy(), EXPECTED)
    np.testing.assert_array_equal(v.numpy(), VALUES)


def test_an_input_the_call_holds_alone_is_written_zero_copy(stats_on):
    """A fresh result of one call, consumed by the next call only, reaches it
    as the same memory, which it may write (TF's forward_input rule)."""
    addresses = {}

    def produce():
        a = np.array(VALUES)
        addresses["produced"] = a.ctypes.data
        return a

    def consume(a):
        addresses["consumed"] = a.ctypes.data
        return normalize(a)

    @tf.function
    def f():
        x = pfb.numpy_function(produce, [], tf.float32)
        return pfb.numpy_function(consume, [x], tf.float32)

    np.testing.assert_array_equal(f().numpy(), EXPECTED)
    assert addresses["consumed"] == addresses["produced"]
    total = pfb.stats().total
    assert total.bytes_copied["shared_input"] == 0
    assert sum(total.bytes_copied.values()) == 0


def test_tf_data_map_matches_tf_and_leaves_the_source_alone():
    source = np.stack([VALUES] * 4)

    def pipeline(f, fn):
        return tf.data.Dataset.from_tensor_slices(source).map(
            lambda x: f(fn, [x], tf.float32), num_parallel_calls=2)

    for fn in (normalize, shuffle_rows):
        want = list(pipeline(tf.numpy_function, fn).as_numpy_iterator())
        for _ in range(2):  # a second epoch reads the source again
            got = list(pipeline(pfb.numpy_function, fn).as_numpy_iterator())
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(source, np.stack([VALUES] * 4))


def test_session_run():
    with tf.Graph().as_default():
        c = tf.constant(VALUES)
        produced = pfb.numpy_function(lambda: np.array(VALUES), [], tf.float32)
        on_own = pfb.numpy_function(normalize, [produced], tf.float32)
        on_constant = pfb.numpy_function(normalize, [c], tf.float32)
        with tf.compat.v1.Session() as session:
            for _ in range(2):
                a, b, kept = session.run([on_own, on_constant, c])
                np.testing.assert_array_equal(a, EXPECTED)
                np.testing.assert_array_equal(b, EXPECTED)
                np.testing.assert_array_equal(kept, VALUES)


def test_under_xla():
    c = tf.constant(VALUES)
    f = tf.function(lambda x: pfb.numpy_function(
        normalize, [x], tf.TensorSpec(VALUES.shape, tf.float32)), jit_compile=True)
    np.testing.assert_array_equal(f(c).numpy(), EXPECTED)
    np.testing.assert_array_equal(c.numpy(), VALUES)


def test_copy_false_keeps_read_only_views_and_their_error():
    f = tf.function(lambda x: pfb.numpy_function(normalize, [x * 1.0], tf.float32,
                                                 copy=False))
    with pytest.raises(tf.errors.OpError, match="read-only"):
        f(tf.constant(VALUES))


def test_copy_true_gives_private_copies():
    c = tf.constant(VALUES)
    f = tf.function(lambda: pfb.numpy_function(normalize, [c], tf.float32, copy=True))
    np.testing.assert_array_equal(f().numpy(), EXPECTED)
    np.testing.assert_array_equal(c.numpy(), VALUES)


def test_array_function_torch_writes_in_place():
    pytest.importorskip("torch")

    def sub_(t):
        t.sub_(1.0).div_(2.0)
        return t

    c = tf.constant(VALUES)
    eager = pfb.array_function(sub_, [c], tf.float32, framework="torch")
    graph = tf.function(lambda x: pfb.array_function(sub_, [x * 1.0], tf.float32,
                                                     framework="torch"))(c)
    for got in (eager, graph):
        np.testing.assert_array_equal(got.numpy(), EXPECTED)
    np.testing.assert_array_equal(c.numpy(), VALUES)
