"""py_function against TensorFlow's, side by side (test_api_parity.py's
helpers and modes): what concerns py_function alone."""
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from test_api_parity import MODES, raised


def _returns_a_new_variable(x):
    return tf.Variable(0.0)


def _returns_a_variable_among_tensors(x):
    return [x, tf.Variable(0.0)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("func, Tout", [
    (_returns_a_new_variable, tf.float32),
    (_returns_a_variable_among_tensors, [tf.float32, tf.float32]),
], ids=["single", "in_a_list"])
def test_returning_a_variable_raises_tfs_error(mode, func, Tout):
    """TF's testEagerReturningVariableRaisesError: UnknownError, its phrase,
    in every mode; pfb names the output and the fix too."""
    x = tf.constant(1.0)
    want = raised(mode, tf.py_function, func, x, Tout)
    got = raised(mode, pfb.py_function, func, x, Tout)
    phrase = "Attempting to return a variable from an eagerly executed py_func"
    assert type(want) is tf.errors.UnknownError and phrase in str(want)
    assert type(got) is tf.errors.UnknownError and phrase in str(got)
    index = 0 if func is _returns_a_new_variable else 1
    assert f"output {index}" in str(got) and "read_value()" in str(got)
