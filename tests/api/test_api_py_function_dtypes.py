"""py_function results of another dtype than Tout's (outputs.pxi, _converted):
TensorFlow's py_function converts a NumPy result with convert_to_tensor,
silently even where a value changes.  pfb converts where no value changes
(ints in range, ints held exactly by a float, floats narrowed as astype
rounds them) and refuses the rest with an error naming the output, the
value, the dtype and the fix; EagerTensors of another dtype, Python values
and numpy_function / py_func keep their rules."""
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import PY_FUNCTION, run

MODES = ["eager", "tf.function", "tf.data"]
X = tf.constant([1.0])

# name -> (what the function returns, Tout): TF's values are right for these.
CONVERTED = {
    "int64_ids_for_int32": (lambda: np.array([0, 7, -3, 2**31 - 1]), tf.int32),
    "int64_for_uint8": (lambda: np.array([0, 255]), tf.uint8),
    "uint8_for_int8": (lambda: np.array([0, 127], np.uint8), tf.int8),
    "int32_for_int64": (lambda: np.array([-5], np.int32), tf.int64),
    "empty_int64_for_int8": (lambda: np.zeros(0, np.int64), tf.int8),
    "float64_for_float32": (lambda: np.random.default_rng(0).random(5), tf.float32),
    "float64_tiny_for_float32": (lambda: np.array([0.1, 1e-50, -1e-300]), tf.float32),
    "float64_inf_nan_for_float32": (lambda: np.array([np.inf, -np.inf, np.nan]), tf.float32),
    "float32_for_float16": (lambda: np.array([0.1, 65504.0], np.float32), tf.float16),
    "float32_for_bfloat16": (lambda: np.array([1.1, 3e38], np.float32), tf.bfloat16),
    "float64_for_bfloat16": (lambda: np.array([2.5, -0.3]), tf.bfloat16),
    "float32_for_float64": (lambda: np.array([1.1], np.float32), tf.float64),
    "int16_for_float32": (lambda: np.array([-7, 300], np.int16), tf.float32),
    "int64_exact_for_float32": (lambda: np.array([2**24, 2**40, -(2**60)]), tf.float32),
    "bool_for_int32": (lambda: np.array([True, False]), tf.int32),
    "complex128_for_complex64": (lambda: np.array([1 + 2j]), tf.complex64),
    "float64_for_complex64": (lambda: np.array([0.5]), tf.complex64),
    "numpy_int64_scalar_for_int32": (lambda: np.int64(3), tf.int32),
    "numpy_float64_scalar_for_float32": (lambda: np.float64(0.1), tf.float32),
}

# name -> (returned, Tout, the value the error shows): TF's value changes.
REFUSED = {
    "int64_2pow40_for_int32": (lambda: np.array([1, 2**40]), tf.int32, "1099511627776"),
    "int64_300_for_uint8": (lambda: np.array([300]), tf.uint8, "300"),
    "int64_negative_for_uint8": (lambda: np.array([-1]), tf.uint8, "-1"),
    "uint64_for_int64": (lambda: np.array([2**63], np.uint64), tf.int64,
                         "9223372036854775808"),
    "float64_1e300_for_float32": (lambda: np.array([0.5, 1e300]), tf.float32, "1e+300"),
    "float32_for_float16_overflow": (lambda: np.array([70000.0], np.float32), tf.float16,
                                     "70000.0"),
    "int64_inexact_for_float32": (lambda: np.array([2**40 + 1]), tf.float32,
                                  "1099511627777"),
    "numpy_scalar_300_for_uint8": (lambda: np.int64(300), tf.uint8, "300"),
}

# Floats to ints (TF truncates 1.5 to 1), to bool, complex to real: today's error.
NOT_CONVERTED = {
    "float64_1_5_for_int32": (lambda: np.array([1.5]), tf.int32),
    "float64_1e300_for_int32": (lambda: np.array([1e300]), tf.int32),
    "int64_for_bool": (lambda: np.array([2]), tf.bool),
    "complex_for_float32": (lambda: np.array([1 + 1j]), tf.float32),
}


def _values(result):
    return np.asarray(result.numpy() if hasattr(result, "numpy") else result)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CONVERTED))
def test_a_result_converts_as_tensorflow_converts_it(case, mode):
    returned, Tout = CONVERTED[case]
    theirs = _values(run(mode, PY_FUNCTION[0], lambda a: returned(), X, Tout))
    ours = _values(run(mode, PY_FUNCTION[1], lambda a: returned(), X, Tout))
    assert ours.dtype == theirs.dtype == Tout.as_numpy_dtype
    np.testing.assert_array_equal(ours, theirs)
    # No value changed (NaN equals NaN here).
    expected = np.asarray(returned())
    if expected.dtype.kind in "iub":
        np.testing.assert_array_equal(ours.astype(expected.dtype), expected)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # TF's
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_tensorflow_would_change_is_a_clear_error(case, mode):
    returned, Tout, shown = REFUSED[case]
    theirs = _values(run(mode, PY_FUNCTION[0], lambda a: returned(), X, Tout))
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.array_equal(theirs.astype(np.float64),
                                  np.asarray(returned()).astype(np.float64))  # TF's changed
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, PY_FUNCTION[1], lambda a: returned(), X, Tout)
    message = info.value.message
    assert "output 0" in message and f"Tout declares {Tout.name}" in message
    assert shown in message
    assert f"astype(np.{Tout.name})" in message or "astype(ml_dtypes" in message
    assert "declare Tout=tf." in message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(NOT_CONVERTED))
def test_floats_to_ints_and_other_kinds_keep_the_dtype_error(case, mode):
    returned, Tout = NOT_CONVERTED[case]
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, PY_FUNCTION[1], lambda a: returned(), X, Tout)
    message = info.value.message
    assert "output 0" in message and f"Tout declares {Tout.name}" in message
    assert str(np.asarray(returned()).dtype) in message


@pytest.mark.parametrize("mode", MODES)
def test_an_eager_tensor_of_another_dtype_is_refused_as_tensorflow_refuses_it(mode):
    func = lambda a: tf.constant([1, 2], tf.int64)
    for api in PY_FUNCTION:
        with pytest.raises(tf.errors.InvalidArgumentError):
            run(mode, api, func, X, tf.int32)


@pytest.mark.parametrize("value, Tout", [(300, tf.uint8), (2.5, tf.int32), ([1.5], tf.int32)])
def test_python_values_keep_their_rule(value, Tout):
    with pytest.raises(tf.errors.InvalidArgumentError):
        pfb.py_function(lambda a: value, [X], Tout)
    assert pfb.py_function(lambda a: 3, [X], tf.uint8).numpy() == 3


@pytest.mark.parametrize("api", [pfb.numpy_function, pfb.py_func,
                                 tf.numpy_function, tf.compat.v1.py_func])
def test_numpy_function_and_py_func_keep_the_dtype_check(api):
    run = tf.function(lambda x: api(lambda a: np.array([1, 2]), [x], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        run(X)


def test_a_conversion_counts_as_a_dtype_conversion_copy(stats_on):
    n = 100
    pfb.py_function(lambda a: np.random.default_rng(0).random(n), [X], tf.float32,
                    name="converted")
    tf.function(lambda x: pfb.py_function(lambda a: np.arange(n), [x], tf.int32,
                                          name="converted"))(X)
    copied = {k: v for k, v in pfb.stats().functions["converted"].bytes_copied.items() if v}
    assert copied == {"dtype_conversion": 2 * n * 4}


def test_bfloat16_conversion_rounds_as_astype():
    got = pfb.py_function(lambda a: np.array([1.1, 1.2345]), [X], tf.bfloat16).numpy()
    np.testing.assert_array_equal(got, np.array([1.1, 1.2345]).astype(ml_dtypes.bfloat16))
