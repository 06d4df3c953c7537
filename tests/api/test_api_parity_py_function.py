"""py_function against TensorFlow's, side by side (api_helpers.py's parity
harness and modes): what concerns py_function alone."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import MODES, raised, run


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


def test_eager_py_func_is_py_function_under_tfs_other_name():
    """Code written against script_ops.eager_py_func ports by changing the
    module: same parameters, called positionally or by keyword, same results."""
    import inspect

    from tensorflow.python.ops import script_ops
    ours = list(inspect.signature(pfb.eager_py_func).parameters)
    theirs = list(inspect.signature(script_ops.eager_py_func).parameters)
    assert ours[:len(theirs)] == theirs == ["func", "inp", "Tout", "name"]
    assert pfb.eager_py_func is pfb.py_function
    assert "eager_py_func" in pfb.__all__
    x = tf.constant([1.0, 2.0])
    for api in (script_ops.eager_py_func, pfb.eager_py_func):
        eager = api(lambda a: a * 2, [x], tf.float32)
        graph = tf.function(
            lambda v: api(func=lambda a: a * 2, inp=[v], Tout=tf.float32, name="twice"))(x)
        assert eager.numpy().tolist() == graph.numpy().tolist() == [2.0, 4.0]


STRING_DTYPE_RESULTS = {
    "1-d": ["h\u00e9", "a\x00b", ""],
    "0-d": "\U0001F600",
    "transposed": [["a", "b"], ["c", "d"]],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", STRING_DTYPE_RESULTS)
def test_string_dtype_result_is_a_string_tensor_as_in_tf(mode, what):
    """NumPy 2's StringDType arrays for Tout=tf.string: TF's py_function
    converts them (UTF-8, NUL bytes kept); so does pfb's."""
    def func(a):
        out = np.array(STRING_DTYPE_RESULTS[what], dtype=np.dtypes.StringDType())
        return out.T if what == "transposed" else out
    x = tf.constant(1.0)
    want = np.asarray(run(mode, tf.py_function, func, x, tf.string))
    got = np.asarray(run(mode, pfb.py_function, func, x, tf.string))
    assert got.shape == want.shape and got.tolist() == want.tolist()
    encode = np.vectorize(lambda text: text.encode(), otypes=[object])
    assert want.tolist() == encode(func(None).astype(object)).tolist()
