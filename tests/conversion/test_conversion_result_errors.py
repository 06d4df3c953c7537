"""The conversion layer's messages for a result of the wrong dtype: every fix
they suggest exists (a NumPy or ml_dtypes type to convert to, a Tout the
bridge supports), whatever dtype the function returned."""
import re

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

conv = pfb._library.conversion()
SUPPORTED = [name for name in conv.DTYPE_NAMES if name != "string"]

# Every NumPy dtype a function may return: the builtin kinds, the other byte
# order, and ml_dtypes' (some of which TF has and the bridge does not).
RETURNED = sorted({np.dtype(c) for c in "?bhilqpBHILQPefdgFDG"}, key=str) + [
    np.dtype(">f4"), np.dtype(">i8"), np.dtype("S3"), np.dtype("U2"), np.dtype(object),
    np.dtype("M8[D]"), np.dtype("m8[s]"), np.dtype("V4"),
    np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.int4)]

CONVERT = re.compile(r"(?:astype\(|dtype=)(\w+)\.(\w+)\)")
DECLARE = re.compile(r"Tout=([\w.]+)")


def _in_graph(result, Tout):
    # In a graph: eagerly a result of another dtype converts where no value
    # changes (as TF's eager call returns it), so zeros would be no error.
    return tf.function(lambda x: pfb.numpy_function(lambda a: result, [x], Tout))(
        tf.constant(1.0))


def _error(result, Tout):
    with pytest.raises(tf.errors.OpError) as info:
        _in_graph(result, Tout)
    return str(info.value)


def _array(dtype):
    if dtype.kind in "SUT":
        return np.array(["1"], dtype)
    if dtype.kind == "O":
        return np.array([1.0], dtype)
    return np.zeros(1, dtype)


def _returns(result, Tout):
    return _in_graph(result, Tout)


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # zeros: exact
@pytest.mark.parametrize("want", SUPPORTED)
@pytest.mark.parametrize("got", RETURNED, ids=str)
def test_every_suggested_fix_exists_and_works(got, want):
    """Each conversion names a real type and, for numbers, makes the result
    the op takes; each Tout named is one the bridge has, and takes it."""
    Tout = getattr(tf, want)
    if got.isnative and got == np.dtype(Tout.as_numpy_dtype):
        return  # not an error
    value = _array(got)
    message = _error(value, Tout)
    assert "Tout=..." not in message
    for module, name in CONVERT.findall(message):
        assert module in ("np", "ml_dtypes"), message
        target = getattr(np if module == "np" else ml_dtypes, name)  # raises if missing
        assert np.dtype(target) == np.dtype(Tout.as_numpy_dtype), message
        if got.kind not in "SUOV" or got == np.dtype(ml_dtypes.bfloat16):
            _returns(value.astype(target), Tout)
    for declared in DECLARE.findall(message):
        assert declared.startswith("tf."), message
        assert declared[3:] in conv.DTYPE_NAMES, message  # a dtype the bridge has
        if declared != "tf.string":
            _returns(value, getattr(tf, declared[3:]))


@pytest.mark.parametrize("got", ["S3", "U2", "O", "T"])
def test_strings_suggest_tf_string(got):
    message = _error(_array(np.dtype(got)), tf.int32)
    assert "declare Tout=tf.string" in message
    assert "astype(np.int32)" in message
    assert "tf.str" not in message.replace("tf.string", "")
    assert "tf.bytes" not in message


def test_bfloat16_is_converted_with_ml_dtypes():
    message = _error(np.ones(1, np.float16), tf.bfloat16)
    assert "value.astype(ml_dtypes.bfloat16)" in message
    assert "np.bfloat16" not in message
    assert "declare Tout=tf.float16" in message


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.int4])
def test_no_tout_is_suggested_for_a_dtype_the_bridge_lacks(dtype):
    message = _error(np.zeros(1, dtype), tf.float32)
    assert "value.astype(np.float32)" in message
    assert "Tout=" not in message


@pytest.mark.parametrize("want", [tf.float32, tf.int32])
def test_another_byte_order_suggests_the_conversion_only(want):
    message = _error(np.zeros(1, ">f4"), want)
    assert "byte order '>f4'" in message
    assert f"value.astype(np.{want.name})" in message
    assert "Tout=" not in message  # under any Tout the byte order is refused


def test_a_python_string_is_named_as_such():
    message = _error("s", tf.int64)
    assert "'s' (str, which NumPy reads as an array of dtype U1)" in message
    assert "np.asarray(value, dtype=np.int64)" in message
    assert "declare Tout=tf.string" in message


def test_a_float_memoryview_names_its_dtype_and_no_bytes_fix():
    message = _error(memoryview(np.zeros(2)), tf.string)
    assert "a memoryview, which NumPy reads as an array of float64" in message
    assert "bytes(value)" not in message
    message = _error(memoryview(np.zeros(2)), tf.float32)
    assert "(memoryview, which NumPy reads as an array of dtype float64)" in message
    assert "np.asarray(value, dtype=np.float32) or declare Tout=tf.float64" in message
