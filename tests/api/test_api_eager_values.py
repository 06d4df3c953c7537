"""Python values in, a dict out, eagerly: TF's eager numpy_function and py_func
call ``func(*[np.array(x) for x in inp])`` and return ``nest.flatten`` of the
result.  pfb's eager calls give the same dtypes and values, in process and in a
pool; in graphs both sides convert inputs with convert_to_tensor."""
import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
import pyfunc_bridge as pfb
from conftest import API_PAIRS

NUMPY_APIS = ["numpy_function", "py_func"]

# Python values whose np.array dtype is not convert_to_tensor's.
VALUES = {
    "float": 1.5,
    "int": 3,
    "bool": True,
    "complex": 1 + 2j,
    "int list": [1, 2],
    "float rows": [[1.0, 2.0], [3.0, 4.5]],
    "tuple": (1, 2.5),
}


def _dtype_seen(api, value):
    seen = []

    def func(a):
        seen.append(a.dtype)
        return a
    out = api(func, [value], tf.as_dtype(np.array(value).dtype))
    return seen[0], out


@pytest.mark.parametrize("what", VALUES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_python_inputs_arrive_as_np_array_makes_them(api_name, what, eager_path):
    ours, theirs = API_PAIRS[api_name]
    value = VALUES[what]
    want_dtype, want = _dtype_seen(theirs, value)
    got_dtype, got = _dtype_seen(ours, value)
    assert got_dtype == want_dtype
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_python_int_input_with_int64_tout_runs_as_with_tensorflow(api_name):
    # The code that failed: 3 became int32 and its int32 result met Tout=int64.
    ours, theirs = API_PAIRS[api_name]
    got = ours(lambda a: a + 1, [3], tf.int64)
    assert got.dtype == tf.int64 and int(got) == int(theirs(lambda a: a + 1, [3], tf.int64))


@pytest.mark.parametrize("value", ["s", b"s"])
def test_string_input_arrives_as_an_object_array_of_bytes(value):
    # A difference (README): inputs travel as tensors, and a tf.string holds
    # bytes; TF's eager shortcut hands over np.array(value), a <U1 or |S1 array.
    seen = []
    pfb.numpy_function(lambda a: seen.append(a) or a, [value], tf.string)
    assert seen[0].dtype == object and seen[0][()] == b"s"


def test_python_inputs_in_a_graph_convert_as_tensorflow():
    seen = []

    @tf.function
    def f():
        return pfb.numpy_function(lambda a: seen.append(a.dtype) or a, [1.5], tf.float32)
    assert float(f()) == 1.5 and seen == [np.float32]


@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_dict_result_is_flattened_by_sorted_key(api_name, eager_path):
    ours, theirs = API_PAIRS[api_name]
    x = np.int64(3)
    want = theirs(pf.keyed_results, [x], [tf.int64, tf.int64])
    got = ours(pf.keyed_results, [x], [tf.int64, tf.int64])
    assert [int(t) for t in got] == [int(t) for t in want] == [4, 3]


def test_dict_result_through_a_pool_is_flattened():
    with pfb.ProcessPool(1) as pool:
        got = pfb.numpy_function(pf.keyed_results, [np.int64(3)], [tf.int64, tf.int64],
                                 executor=pool)
    assert [int(t) for t in got] == [4, 3]


def test_dict_result_in_a_graph_is_tensorflows_internal_error():
    @tf.function
    def f():
        return pfb.numpy_function(lambda a: {"a": a}, [1.0], tf.float32)
    with pytest.raises(tf.errors.InternalError, match="Unsupported object type dict"):
        f()


@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_wider_eager_result_converts_where_no_value_changes(api_name, eager_path):
    # TF's script_ops_test: np.array(1) + np.array(2) is int64 3, for Tout=int32;
    # TF's eager call returns it unchecked, pfb's in Tout's dtype.
    ours, theirs = API_PAIRS[api_name]
    want = theirs(lambda a, b: a + b, [1, 2], tf.int32)
    got = ours(lambda a, b: a + b, [1, 2], tf.int32)
    assert got.dtype == tf.int32 and int(got) == int(want) == 3
    got = ours(lambda a: a + 0.5, [1.0], tf.float32)
    assert got.dtype == tf.float32 and float(got) == 1.5


@pytest.mark.parametrize("func, phrase", [
    (lambda a: a * 2 ** 40, "out of range for int32"),
    (lambda a: a + 0.5, "float64"),
])
def test_eager_result_that_would_change_is_refused(func, phrase):
    # TF returns int64 2**40 or float64 1.5 for Tout=int32; pfb refuses where
    # Tout's dtype cannot hold the value (no overflow, no truncation).
    with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
        pfb.numpy_function(func, [1 if "range" in phrase else 1.0], tf.int32)


def test_graph_results_keep_tensorflows_dtype_check():
    @tf.function
    def f(x):
        return pfb.numpy_function(lambda a: a.astype(np.int64), [x], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="int64"):
        f(tf.constant(1))


def test_pool_eager_result_converts_as_in_process():
    with pfb.ProcessPool(1) as pool:
        got = pfb.numpy_function(pf.add, [1, 2], tf.int32, executor=pool)
    assert got.dtype == tf.int32 and int(got) == 3
