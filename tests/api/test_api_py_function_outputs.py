"""pfb.py_function's outputs against tf.py_function's: what the function
returned wrong (named at run time), composite outputs and inputs, and TF
errors raised inside the function."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import run_error

X = tf.constant([0.5, -1.0, 2.0, 3.0])


# --------------------------------------------------------------------------
# Run-time errors about what the function returned.

def _run_error(func, Tout, inputs=None, mode="eager"):
    """Runs the op and returns the OpError it raised."""
    return run_error(pfb.py_function, func, Tout, [X] if inputs is None else inputs, mode)


MODES = ["eager", "tf_function"]


@pytest.mark.parametrize("mode", MODES)
def test_dtype_mismatch_tensor(mode):
    err = _run_error(lambda a: (a, tf.cast(a, tf.float64)), [tf.float32, tf.float32],
                     mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 1" in err.message
    assert "float32" in err.message and "float64" in err.message


def test_dtype_mismatch_ndarray():
    # Floats never convert to ints (tests/api/test_api_py_function_dtypes.py).
    err = _run_error(lambda a: a.numpy(), tf.int16)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 0" in err.message
    assert "float32" in err.message and "int16" in err.message


def test_python_float_for_int32_is_error():
    err = _run_error(lambda a: 2.5, tf.int32)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int32" in err.message


# --------------------------------------------------------------------------
# Composite outputs and inputs.

RAGGED = tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)
SPARSE = tf.SparseTensorSpec([None, None], tf.float32)


def _split(a):
    return tf.RaggedTensor.from_row_lengths(a, [1, 3])


def _sparse(a):
    return tf.sparse.from_dense(tf.reshape(a, [2, 2]) * tf.constant([[1.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("mode", MODES)
def test_ragged_output(mode):
    if mode == "eager":
        y = pfb.py_function(_split, [X], RAGGED)
    else:
        @tf.function
        def f(x):
            r = pfb.py_function(_split, [x], RAGGED)
            assert isinstance(r, tf.RaggedTensor)
            return r.row_lengths(), r.flat_values

        lengths, values = f(X)
        y = tf.RaggedTensor.from_row_lengths(values, lengths)
    assert isinstance(y, tf.RaggedTensor)
    assert y.to_list() == _split(X).to_list()


@pytest.mark.parametrize("mode", MODES)
def test_sparse_output(mode):
    if mode == "eager":
        y = pfb.py_function(_sparse, [X], SPARSE)
    else:
        @tf.function
        def f(x):
            s = pfb.py_function(_sparse, [x], SPARSE)
            assert isinstance(s, tf.SparseTensor)
            return s.indices, s.values, s.dense_shape

        y = tf.SparseTensor(*f(X))
    assert isinstance(y, tf.SparseTensor)
    want = _sparse(X)
    np.testing.assert_array_equal(y.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(y.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(y.dense_shape.numpy(), want.dense_shape.numpy())


def test_composite_and_dense_outputs_together():
    d, r, s = pfb.py_function(lambda a: (a * 2, _split(a), _sparse(a)), [X],
                              [tf.float32, RAGGED, SPARSE])
    np.testing.assert_array_equal(d.numpy(), X.numpy() * 2)
    assert r.to_list() == _split(X).to_list()
    np.testing.assert_array_equal(tf.sparse.to_dense(s).numpy(),
                                  tf.sparse.to_dense(_sparse(X)).numpy())


def test_composite_output_in_session():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [4])
        r = pfb.py_function(_split, [p], RAGGED)
        with tf.compat.v1.Session() as sess:
            got = sess.run(r, {p: X.numpy()})
    assert got.to_list() == _split(X).to_list()


@pytest.mark.parametrize("mode", MODES)
def test_composite_inputs(mode):
    ragged = tf.ragged.constant([[1, 2], [3], []])
    sparse = tf.sparse.from_dense(tf.constant([[0, 5], [7, 0]]))
    seen = []

    def func(r, d, s):
        seen.append((type(r), type(d), type(s)))
        return (tf.reduce_sum(r, axis=1) + d,
                tf.sparse.to_dense(s) * 2,
                r * 10)

    Tout = [tf.int32, tf.int32, tf.RaggedTensorSpec([3, None], tf.int32, ragged_rank=1)]
    dense = tf.constant([100, 200, 300])
    if mode == "eager":
        a, b, c = pfb.py_function(func, [ragged, dense, sparse], Tout)
    else:
        @tf.function
        def f(r, d, s):
            a, b, c = pfb.py_function(func, [r, d, s], Tout)
            return a, b, c.flat_values, c.row_splits

        a, b, values, splits = f(ragged, dense, sparse)
        c = tf.RaggedTensor.from_row_splits(values, splits)
    assert seen == [(tf.RaggedTensor, type(dense), tf.SparseTensor)]
    assert a.numpy().tolist() == [103, 203, 300]
    assert b.numpy().tolist() == [[0, 10], [14, 0]]
    assert c.to_list() == [[10, 20], [30], []]


@pytest.mark.parametrize("returned,Tout,words", [
    (lambda a: a, RAGGED, ["output 0", "RaggedTensor"]),
    (_split, tf.float32, ["output 0", "RaggedTensor", "dense"]),
    (lambda a: tf.RaggedTensor.from_row_lengths(tf.cast(a, tf.int32), [1, 3]), RAGGED,
     ["output 0", "int32", "float32"]),
    (lambda a: tf.RaggedTensor.from_row_lengths(a, [1, 3]),
     tf.RaggedTensorSpec([None, None, None], tf.float32, ragged_rank=2),
     ["output 0", "ragged_rank"]),
    (lambda a: tf.reshape(a, [2, 2]), SPARSE, ["output 0", "SparseTensor"]),
    (_split, SPARSE, ["output 0", "SparseTensor"]),
    (lambda a: (a, _sparse(a)), [tf.float32, tf.float32], ["output 1", "SparseTensor"]),
], ids=["dense_for_ragged", "ragged_for_dense", "ragged_dtype", "ragged_rank",
        "dense_for_sparse", "ragged_for_sparse", "sparse_for_dense_1"])
@pytest.mark.parametrize("mode", MODES)
def test_composite_mismatch(mode, returned, Tout, words):
    err = _run_error(returned, Tout, mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    for word in words:
        assert word in err.message


# --------------------------------------------------------------------------
# Python exceptions -> TF error classes, with the traceback.

def test_tf_error_inside_the_function_maps_like_tf():
    # A TF OpError raised by the function is "anything else" in the table, as in
    # tf.py_function; the message keeps TF's text and the traceback.
    def bad_reshape(a):
        return tf.reshape(a, [3])

    err = _run_error(bad_reshape, tf.float32)
    with pytest.raises(tf.errors.OpError) as ref:
        tf.py_function(bad_reshape, [X], tf.float32)
    assert type(err) is type(ref.value) is tf.errors.UnknownError
    assert "bad_reshape" in err.message
    assert "reshape" in err.message and "InvalidArgumentError" in err.message
