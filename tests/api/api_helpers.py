"""What the test_api*.py files share: the parity harness (TensorFlow's
builtin and pfb's op run the same way in every mode, test_api_parity*.py)
and the run-time error of an op that a test expects to fail."""
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

MODES = ["eager", "tf.function", "tf.data", "session"]
GRAPH_MODES = ["tf.function", "tf.data", "session"]

# name -> (TF's function, pfb's), both called as api(func, inp, Tout).
NUMPY_APIS = {
    "numpy_function": (tf.numpy_function, pfb.numpy_function),
    "py_func": (tf.compat.v1.py_func, pfb.py_func),
}
PY_FUNCTION = (tf.py_function, pfb.py_function)
ALL_APIS = {**NUMPY_APIS, "py_function": PY_FUNCTION}


def run(mode, api, func, value, Tout):
    """api(func, [value], Tout) in `mode`; the result as the caller sees it
    (NumPy values for tf.data and Session)."""
    if mode == "eager":
        return api(func, [value], Tout)
    if mode == "tf.function":
        return tf.function(lambda x: api(func, [x], Tout))(value)
    if mode == "tf.data":
        ds = tf.data.Dataset.from_tensors(value).map(
            lambda x: api(func, [x], Tout), num_parallel_calls=2)
        return next(iter(ds.as_numpy_iterator()))
    assert mode == "session"
    with tf.Graph().as_default():
        y = api(func, [tf.constant(value.numpy())], Tout)
        with tf.compat.v1.Session() as sess:
            return sess.run(y)


def raised(mode, api, func, value, Tout):
    """The exception that run(...) raises (fails the test if none)."""
    with pytest.raises(Exception) as info:
        run(mode, api, func, value, Tout)
    return info.value


def received(mode, api, value, Tout):
    """What the function receives: (type, dtype, shape) of its one argument."""
    seen = []

    def func(x):
        seen.append((type(x), getattr(x, "dtype", None), getattr(x, "shape", None)))
        return x
    run(mode, api, func, value, Tout)
    assert len(seen) == 1
    return seen[0]


def run_error(api, func, Tout, inputs, mode="eager"):
    """Runs `api(func, inputs, Tout)` eagerly or in a tf.function (`mode`)
    and returns the OpError it raised."""
    if mode == "eager":
        with pytest.raises(tf.errors.OpError) as info:
            api(func, inputs, Tout)
    else:
        @tf.function
        def f(*xs):
            result = api(func, list(xs), Tout)
            # No outputs: the Operation, which runs by automatic control dependencies.
            return None if isinstance(result, tf.Operation) else result

        with pytest.raises(tf.errors.OpError) as info:
            f(*inputs)
    return info.value
