"""The public op layer: pfb.numpy_function / pfb.py_func against TF's builtins:
results, Tout forms, the decorator, name=.

The contract every API shares (modes, Tout, counts, shapes, exceptions,
argument errors, lifetimes) is in test_api_contract.py; these ops' argument
and result checks in test_api_validation.py, their registry in
test_api_registry.py, the import in test_api_import_cost.py."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

STATEFUL_OP = "PyfuncBridge>NumpyFunction"
STATELESS_OP = "PyfuncBridge>NumpyFunctionStateless"


# --------------------------------------------------------------------------
# Results (the modes every API shares are in test_api_contract.py).

def test_session_runs_py_func_per_feed():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None])
        y = pfb.py_func(np.cumsum, [x], tf.float64)
        with tf.compat.v1.Session() as sess:
            first = sess.run(y, {x: [1.0, 2.0, 3.0]})
            second = sess.run(y, {x: [5.0, -5.0]})
    np.testing.assert_array_equal(first, [1.0, 3.0, 6.0])
    np.testing.assert_array_equal(second, [5.0, 0.0])


# --------------------------------------------------------------------------
# Tout forms.

X = tf.constant([1.0, 2.0, 3.0, 4.0])


def test_single_dtype_returns_a_tensor():
    y = pfb.numpy_function(lambda a: a + 1, [X], tf.float32)
    assert isinstance(y, tf.Tensor)
    np.testing.assert_array_equal(y.numpy(), [2, 3, 4, 5])


def test_numpy_dtype_tout():
    y = pfb.numpy_function(lambda a: a * 2, [X], np.float32)
    assert isinstance(y, tf.Tensor)
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), [2, 4, 6, 8])


@pfb.numpy_function(Tout=tf.TensorSpec([None, 2], tf.float32))
def pairs(a):
    return a.reshape(-1, 2)


def test_decorator_declares_static_shape():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        y = pairs(x)
        seen.append(y.shape)
        return y

    out = f(tf.range(6, dtype=tf.float32))
    assert len(seen) == 1
    assert seen[0].as_list() == [None, 2]
    np.testing.assert_array_equal(out.numpy(), [[0, 1], [2, 3], [4, 5]])
    # Eagerly too.
    assert pairs(tf.range(4, dtype=tf.float32)).shape == (2, 2)


def test_without_tensorspec_shape_is_unknown():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        y = pfb.numpy_function(lambda a: a.reshape(-1, 2), [x], tf.float32)
        seen.append(y.shape)
        return y

    f(tf.range(4, dtype=tf.float32))
    assert seen[0].rank is None


def test_list_mixing_tensorspec_and_dtype():
    seen = []

    def func(a):
        return a.astype(np.int32), np.array([str(v).encode() for v in a], dtype=object)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        ys = pfb.numpy_function(func, [x], [tf.TensorSpec([None], tf.int32), tf.string])
        seen.append([y.shape for y in ys])
        return ys

    ints, strings = f(tf.constant([1.0, 2.0]))
    assert seen[0][0].as_list() == [None]
    assert seen[0][1].rank is None
    np.testing.assert_array_equal(ints.numpy(), [1, 2])
    assert ints.dtype == tf.int32
    assert list(strings.numpy()) == [b"1.0", b"2.0"]


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, a):
        self.calls.append(np.array(a))  # returns None


def test_no_outputs_eager_runs_side_effect():
    rec = _Recorder()
    result = pfb.numpy_function(rec, [X], [])
    assert not result  # nothing to return
    assert len(rec.calls) == 1
    np.testing.assert_array_equal(rec.calls[0], [1, 2, 3, 4])


def test_no_outputs_tf_function_runs_side_effect():
    rec = _Recorder()

    @tf.function
    def f(x):
        pfb.numpy_function(rec, [x], [])
        return x + 1

    f(tf.constant([7.0]))
    f(tf.constant([8.0]))
    assert [c.tolist() for c in rec.calls] == [[7.0], [8.0]]


def test_no_outputs_session_runs_side_effect():
    rec = _Recorder()
    with tf.Graph().as_default():
        op = pfb.py_func(rec, [tf.constant([5, 6])], [])
        assert isinstance(op, tf.Operation)
        assert op.type == STATEFUL_OP
        with tf.compat.v1.Session() as sess:
            sess.run(op)
            sess.run(op)
    assert [c.tolist() for c in rec.calls] == [[5, 6], [5, 6]]


# --------------------------------------------------------------------------
# Decorator form.

def test_decorator_keyword_args():
    @pfb.numpy_function(Tout=tf.int64, stateful=False)
    def square(a):
        return a * a

    assert square.__name__ == "square"
    np.testing.assert_array_equal(square(tf.constant([2, 3], tf.int64)).numpy(), [4, 9])


def test_decorator_positional_args_and_several_inputs():
    @pfb.numpy_function(None, None, [tf.float64, tf.float64])
    def sum_and_diff(a, b):
        return a + b, a - b

    s, d = sum_and_diff(tf.constant([1.0, 2.0], tf.float64), tf.constant([0.5, 4.0], tf.float64))
    np.testing.assert_array_equal(s.numpy(), [1.5, 6.0])
    np.testing.assert_array_equal(d.numpy(), [0.5, -2.0])


def test_decorator_inside_tf_function():
    @pfb.numpy_function(Tout=tf.float32, name="decorated_op")
    def plus_one(a):
        return a + 1

    names = []

    @tf.function
    def f(x):
        y = plus_one(x)
        names.append(y.op.name)
        return y

    np.testing.assert_array_equal(f(tf.constant([1.0])).numpy(), [2.0])
    assert "decorated_op" in names[0]


def test_bare_decorator_without_tout_is_type_error():
    with pytest.raises(TypeError, match="Tout"):
        @pfb.numpy_function
        def f(a):
            return a


# --------------------------------------------------------------------------
# name=

@pytest.mark.parametrize("stateful", [True, False])
def test_name_sets_op_name_in_graph(stateful):
    with tf.Graph().as_default():
        y = pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32,
                               stateful=stateful, name="my_bridge")
        z = pfb.py_func(np.negative, [tf.constant(1.0)], [tf.float32], name="my_bridge")
        assert y.op.name.startswith("my_bridge")
        assert z[0].op.name.startswith("my_bridge")
        assert y.op.name != z[0].op.name  # uniquified
        assert y.op.type == (STATEFUL_OP if stateful else STATELESS_OP)


def test_name_inside_tf_function():
    names = []

    @tf.function
    def f(x):
        with tf.name_scope("outer"):
            y = pfb.numpy_function(np.negative, [x], tf.float32, name="inner_bridge")
        names.append(y.op.name)
        return y

    assert f(tf.constant(2.0)).numpy() == -2.0
    assert names[0].startswith("outer/inner_bridge")


def test_name_accepted_eagerly():
    y = pfb.numpy_function(np.negative, [X], tf.float32, name="eager_name")
    np.testing.assert_array_equal(y.numpy(), [-1, -2, -3, -4])

