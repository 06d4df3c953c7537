"""The public op layer's checks: pfb.numpy_function / pfb.py_func refuse
bad Tout, inputs and copy= when the op is made, and name what the function
returned wrong when it runs, as TensorFlow's builtins would."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import run_error

X = tf.constant([1.0, 2.0, 3.0, 4.0])


# --------------------------------------------------------------------------
# Errors at construction.

@pytest.mark.parametrize("api", [pfb.numpy_function, pfb.py_func])
def test_tout_none_is_type_error(api):
    with pytest.raises(TypeError, match="Missing required argument: 'Tout'"):
        api(lambda a: a, [X], None)


@pytest.mark.parametrize("dtype", [tf.resource, tf.qint8, tf.variant])
@pytest.mark.parametrize("as_list", [False, True])
def test_unsupported_tout_dtype_is_type_error(dtype, as_list):
    Tout = [tf.float32, dtype] if as_list else dtype
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a: a, [X], Tout)
    msg = str(info.value)
    assert dtype.name in msg
    assert "does not support" in msg
    assert ("Tout[1]" in msg) if as_list else msg.startswith("Tout")


def test_unsupported_tensorspec_dtype_is_type_error():
    with pytest.raises(TypeError, match="qint8"):
        pfb.numpy_function(lambda a: a, [X], tf.TensorSpec([None], tf.qint8))


def test_tout_not_a_dtype_is_type_error():
    with pytest.raises(TypeError, match="Tout"):
        pfb.numpy_function(lambda a: a, [X], "not-a-dtype")


@pytest.mark.parametrize("spec", [
    tf.RaggedTensorSpec([None, None], tf.float32),
    tf.SparseTensorSpec([None, 3], tf.float32),
], ids=["ragged", "sparse"])
def test_composite_typespec_is_type_error(spec):
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a: a, [X], spec)
    assert type(spec).__name__ in str(info.value)
    assert "composite" in str(info.value)


@pytest.mark.parametrize("copy", ["yes", 2, 1, 0, "none", "True"])
def test_bad_copy_is_value_error(copy):
    with pytest.raises(ValueError, match="copy must be None, True or False") as info:
        pfb.numpy_function(lambda a: a, [X], tf.float32, copy=copy)
    assert repr(copy) in str(info.value)


def test_tuple_inp_is_accepted():
    y = pfb.numpy_function(lambda a, b: a + b, (X, X), tf.float32)
    np.testing.assert_array_equal(y.numpy(), [2, 4, 6, 8])


@pytest.mark.parametrize("composite", [
    lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]),
    lambda: tf.sparse.from_dense(tf.constant([[0.0, 1.0]])),
], ids=["RaggedTensor", "SparseTensor"])
def test_composite_input_is_type_error(composite):
    value = composite()
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a, b: a, [X, value], tf.float32)
    assert "inp[1]" in str(info.value)
    assert type(value).__name__ in str(info.value)


def test_unsupported_input_dtype_is_type_error():
    with pytest.raises(TypeError, match="inp\\[0\\].*qint8"):
        pfb.numpy_function(lambda a: a, [tf.constant([1], tf.qint8)], tf.float32)


# --------------------------------------------------------------------------
# Errors at run time (what the function returned).

def _run_error(func, Tout, inputs=None, mode="eager"):
    """Runs the op and returns the OpError it raised."""
    return run_error(pfb.numpy_function, func, Tout, [X] if inputs is None else inputs, mode)


MODES = ["eager", "tf_function"]


@pytest.mark.parametrize("mode", MODES)
def test_wrong_dtype_returned(mode):
    # (floats for ints: eagerly a dtype converts only where no value changes)
    err = _run_error(lambda a: a.astype(np.float64) + 0.5, tf.int32, mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 0" in err.message
    assert "int32" in err.message and "float64" in err.message
    assert "astype" in err.message


def test_wrong_dtype_names_the_output_index():
    err = _run_error(lambda a: (a, a.astype(np.int16)), [tf.float32, tf.float32],
                     mode="tf_function")
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 1" in err.message
    assert "int16" in err.message and "astype(np.float32)" in err.message


def test_declared_static_dimension_mismatch():
    err = _run_error(lambda a: a.reshape(2, 2), tf.TensorSpec([2, 3], tf.float32))
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "(2, 3)" in err.message and "(2, 2)" in err.message


def test_declared_shape_matches():
    y = pfb.numpy_function(lambda a: a.reshape(2, 2), [X], tf.TensorSpec([2, None], tf.float32))
    assert y.shape == (2, 2)


@pytest.mark.parametrize("value", [7, 1.5, np.arange(3, dtype=np.float32)],
                         ids=["int", "float", "ndarray"])
def test_string_declared_number_returned(value):
    err = _run_error(lambda a: value, tf.string)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "string" in err.message


def test_python_float_for_int32_is_lossy_error():
    err = _run_error(lambda a: 2.5, tf.int32)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int32" in err.message and "without loss" in err.message


def test_python_list_of_floats_for_int_is_error():
    err = _run_error(lambda a: ([1.5, 2.0],), [tf.int64])
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int64" in err.message and "without loss" in err.message


def test_python_list_for_single_output_counts_as_outputs():
    # As in TF: a list or tuple holds one value per output.
    err = _run_error(lambda a: [1.0, 2.0], tf.float64)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "returned 2 value" in err.message and "np.asarray" in err.message


@pytest.mark.parametrize("value,Tout,want", [
    (3, tf.float32, np.float32(3.0)),
    (-3, tf.int8, np.int8(-3)),
    (2.5, tf.float64, np.float64(2.5)),
    (True, tf.bool, np.bool_(True)),
    (1 + 2j, tf.complex64, np.complex64(1 + 2j)),
    (np.float32(1.25), tf.float32, np.float32(1.25)),
    ("h\u00e9", tf.string, "h\u00e9".encode()),
    (b"raw", tf.string, b"raw"),
], ids=["int->float32", "int->int8", "float->float64", "bool", "complex", "np.float32",
        "str", "bytes"])
def test_python_values_convert(value, Tout, want):
    y = pfb.numpy_function(lambda a: value, [X], Tout)
    assert y.dtype == Tout
    assert y.shape == ()
    assert y.numpy() == want


def test_nested_python_list_converts():
    y = pfb.numpy_function(lambda a: ([[1, 2], [3, 4]],), [X], [tf.float64])  # eagerly a tensor
    assert y.dtype == tf.float64
    np.testing.assert_array_equal(y.numpy(), [[1.0, 2.0], [3.0, 4.0]])
