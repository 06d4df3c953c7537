"""The op layer's side of travel: the attributes that name importable
functions or pickle them on request, declarations, trust, and the pickle
limit."""
import os
import pickle
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import travel_functions
from pyfunc_bridge import _portable
from travel_helpers import X


# The op layer: attributes, declarations, trust, the pickle limit.

def _pfb_nodes(fn, *specs):
    graph = tf.function(fn).get_concrete_function(*specs).graph.as_graph_def()
    return [n for n in graph.node if n.op.startswith("PyfuncBridge>")]


def test_attributes_name_importable_functions_and_pickle_on_request():
    spec = tf.TensorSpec([None], tf.float32)
    named, lam, pickled = _pfb_nodes(lambda x: [
        pfb.numpy_function(travel_functions.times2, [x], tf.float32),
        pfb.numpy_function(lambda a: a, [x], tf.float32),
        pfb.numpy_function(lambda a: a, [x], tf.float32, portable=True)], spec)
    assert named.attr["reference"].s == b"travel_functions:times2"
    assert named.attr["pickled"].s == b""
    assert lam.attr["reference"].s == b"" and lam.attr["pickled"].s == b""
    assert pickled.attr["pickled"].s != b""


@pytest.mark.parametrize("api", ["py_func", "py_function", "array_function"])
def test_every_api_pickles_on_request(api):
    build = {
        "py_func": lambda x: pfb.py_func(lambda a: a, [x], tf.float32, portable=True),
        "py_function": lambda x: pfb.py_function(lambda a: a, [x], tf.float32,
                                                 portable=True),
        "array_function": lambda x: pfb.array_function(
            lambda a: a, [x], tf.float32, framework="numpy", portable=True),
    }[api]
    (node,) = _pfb_nodes(build, tf.TensorSpec([None], tf.float32))
    assert node.attr["pickled"].s != b""
    assert node.attr["framework"].s == b""


@pytest.mark.parametrize("api", ["numpy_function", "py_func", "py_function",
                                 "array_function"])
def test_every_api_pickles_an_autograph_converted_function_as_written(api):
    """tf.function converts the lambda defined in the traced one; the op
    embeds the lambda as written (py_function's, inside its caller)."""
    build = {
        "numpy_function": lambda x: pfb.numpy_function(lambda a: np.negative(a), [x],
                                                       tf.float32, portable=True),
        "py_func": lambda x: pfb.py_func(lambda a: np.negative(a), [x], tf.float32,
                                         portable=True),
        "py_function": lambda x: pfb.py_function(lambda a: tf.negative(a), [x],
                                                 tf.float32, portable=True),
        "array_function": lambda x: pfb.array_function(
            lambda a: np.negative(a), [x], tf.float32, framework="numpy", portable=True),
    }[api]
    (node,) = _pfb_nodes(build, tf.TensorSpec([None], tf.float32))
    data = node.attr["pickled"].s
    assert b"converted_call" not in data and b"__autograph_generated" not in data
    assert os.path.basename(__file__).encode() in data  # the lambda's own code
    if api != "py_function":  # (its caller takes tensors)
        np.testing.assert_array_equal(pickle.loads(data)(np.array([1.0, -2.0])), [-1.0, 2.0])


def test_array_function_records_its_framework():
    pytest.importorskip("torch")
    (node,) = _pfb_nodes(lambda x: pfb.array_function(
        travel_functions.torch_softplus, [x], tf.float32, framework="torch"),
        tf.TensorSpec([None], tf.float32))
    assert node.attr["framework"].s == b"torch"
    assert node.attr["reference"].s == b"travel_functions:torch_softplus"


def test_decorator_forms_declare_their_functions():
    namespace = {"__name__": "tests_declared_here", "pfb": pfb, "tf": tf}
    exec(textwrap.dedent("""
        @pfb.numpy_function(Tout=tf.float32)
        def np_double(a):
            return a * 2

        @pfb.py_function(Tout=tf.float32)
        def py_double(a):
            return a * 2
    """), namespace)
    try:
        assert _portable._declared["tests_declared_here:np_double"] is \
            namespace["np_double"].__wrapped__
        assert _portable._declared["tests_declared_here:py_double"] is \
            namespace["py_double"].__wrapped__
    finally:
        for name in ("np_double", "py_double"):
            _portable._declared.pop(f"tests_declared_here:{name}", None)


def test_decorator_forms_pass_portable():
    (node,) = _pfb_nodes(
        pfb.numpy_function(Tout=tf.float32, portable=True)(lambda a: a),
        tf.TensorSpec([None], tf.float32))
    assert node.attr["pickled"].s != b""


def test_py_function_with_composite_outputs_has_no_reference():
    (node,) = _pfb_nodes(lambda x: pfb.py_function(
        travel_functions.cube, [x],
        tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)).values,
        tf.TensorSpec([None], tf.float32))
    assert node.attr["reference"].s == b""


def test_portable_rejects_what_cannot_be_named():
    with pytest.raises(ValueError, match="lambda or a local function"):
        pfb.portable(lambda a: a)

    def main_function(a):
        return a
    main_function.__module__, main_function.__qualname__ = "__main__", "main_function"
    with pytest.raises(ValueError, match="__main__"):
        pfb.portable(main_function)
    with pytest.raises(TypeError, match="module-level functions"):
        pfb.portable(42)


def test_portable_returns_the_function():
    assert pfb.portable(travel_functions.times2) is travel_functions.times2


def test_trust_pickled(monkeypatch):
    previous = pfb.trust_pickled(False)
    try:
        monkeypatch.setenv("PFB_TRUST_PICKLED", "1")
        assert _portable.trusted() is False  # an explicit call wins
        assert pfb.trust_pickled(True) is False
        assert _portable.trusted() is True
        with pytest.raises(TypeError, match="True or False"):
            pfb.trust_pickled("yes")
        _portable._trust = None
        assert _portable.trusted() is True  # the environment
        monkeypatch.setenv("PFB_TRUST_PICKLED", "0")
        assert _portable.trusted() is False
    finally:
        pfb.trust_pickled(previous)


def test_portable_flag_must_be_bool():
    with pytest.raises(TypeError, match="portable must be True or False"):
        _pfb_nodes(lambda x: pfb.numpy_function(lambda a: a, [x], tf.float32,
                                                portable=1),
                   tf.TensorSpec([None], tf.float32))


def test_pickle_over_the_limit_names_what_it_captures():
    big = np.zeros(_portable.MAX_PICKLED_BYTES // 8 + 1000)

    def uses_big(a):
        return a + big[0]
    with pytest.raises(ValueError) as info:
        _pfb_nodes(lambda x: pfb.numpy_function(uses_big, [x], tf.float64, portable=True),
                   tf.TensorSpec([None], tf.float64))
    message = str(info.value)
    assert "'big' (a ndarray" in message
    assert f"{_portable.MAX_PICKLED_BYTES:,}-byte limit" in message
    assert "inp=[...]" in message and "@pfb.portable" in message


def test_unpicklable_capture_is_a_clear_error():
    lock = threading.Lock()

    def holds_lock(a):
        with lock:
            return a
    with pytest.raises(TypeError, match="cannot be pickled"):
        _pfb_nodes(lambda x: pfb.numpy_function(holds_lock, [x], tf.float32,
                                                portable=True),
                   tf.TensorSpec([None], tf.float32))


def test_eager_calls_accept_portable():
    y = pfb.numpy_function(lambda a: a + 1, [tf.constant(X)], tf.float32, portable=True)
    np.testing.assert_array_equal(y.numpy(), X + 1)
