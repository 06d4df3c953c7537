"""Drop-in parity of errors: TensorFlow's builtins and pfb's ops, side by
side (api_helpers.py's harness), agree on a func that is not callable,
results without a tensor form, and error texts."""
import re

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import ALL_APIS, MODES, NUMPY_APIS, raised, run


# ---------------------------------------------------------------------------
# 4. func that is not callable.

def _not_callable_error(api, graph):
    with pytest.raises(Exception) as info:
        if graph:
            with tf.Graph().as_default():
                api(3, [tf.constant(1.0)], tf.float32)
        else:
            api(3, [tf.constant(1.0)], tf.float32)
    return info.value


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("api_name", ALL_APIS)
def test_not_callable_is_caught_as_tf_raises_it(api_name, graph):
    tf_api, pfb_api = ALL_APIS[api_name]
    want = _not_callable_error(tf_api, graph)
    got = _not_callable_error(pfb_api, graph)
    # TF raises ValueError, or TypeError where it calls the function at once;
    # pfb's error is both.
    assert isinstance(got, type(want))
    assert isinstance(got, ValueError) and isinstance(got, TypeError)
    assert "callable" in str(got) and "int" in str(got)


def test_array_function_not_callable_is_value_and_type_error():
    with pytest.raises(ValueError, match="callable") as info:
        pfb.array_function(3, [tf.constant(1.0)], tf.float32, framework="numpy")
    assert isinstance(info.value, TypeError)


# ---------------------------------------------------------------------------
# 5. Results without a tensor form.

STRUCTURED = np.zeros(2, dtype=[("a", "f4"), ("b", "i4")])
UNSUPPORTED = {
    "structured": (lambda a: STRUCTURED, "Unsupported numpy data type"),
    # TF: "Unsupported numpy type: NPY_DATETIME"; pfb: "... data type".
    "datetime": (lambda a: np.array(["2020-01-01"], "M8[D]"), "Unsupported numpy"),
    "dict": (lambda a: {"a": 1}, "Unsupported object type dict"),
    "object": (lambda a: object(), "Unsupported object type object"),
    # An object array of numbers, or of strings with a None among them.
    "numbers": (lambda a: np.array([1.0, 2.0], dtype=object), "Unsupported object type float"),
    "none": (lambda a: np.array([b"a", None], dtype=object), "Unsupported object type NoneType"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
@pytest.mark.parametrize("what", UNSUPPORTED)
def test_unsupported_result_raises_tfs_class(mode, api_name, what):
    tf_api, pfb_api = NUMPY_APIS[api_name]
    func, phrase = UNSUPPORTED[what]
    x = tf.constant([1.0])
    if mode == "eager" and what == "dict":
        # TF's eager numpy_function returns nest.flatten of the result (a
        # dict's values, by sorted key): so does pfb's, in Tout's dtype.
        assert int(run(mode, tf_api, func, x, tf.float32)) == 1
        out = run(mode, pfb_api, func, x, tf.float32)
        assert out.dtype == tf.float32 and float(out) == 1.0
        return
    got = raised(mode, pfb_api, func, x, tf.float32)
    assert phrase in str(got)
    assert "output 0" in str(got)
    want = raised(mode, tf_api, func, x, tf.float32)
    assert isinstance(got, type(want))
    if mode == "eager":
        assert type(want) is ValueError
        # The eager error is also the graph's class.
        assert isinstance(got, tf.errors.InternalError)
    else:
        assert type(want) is tf.errors.InternalError
        assert phrase in str(want)


@pytest.mark.parametrize("what", ["dict", "object", "structured", "datetime", "numbers", "none"])
def test_unsupported_string_result_raises_tfs_class(what):
    func, phrase = UNSUPPORTED[what]
    x = tf.constant(["a"])
    want = raised("tf.function", tf.numpy_function, func, x, tf.string)
    got = raised("tf.function", pfb.numpy_function, func, x, tf.string)
    assert isinstance(got, type(want))
    assert phrase in str(got) and phrase in str(want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", ["structured", "dict", "object"])
def test_unsupported_py_function_result_raises_tfs_class(mode, what):
    func, phrase = UNSUPPORTED[what]
    x = tf.constant([1.0])
    want = raised(mode, tf.py_function, func, x, tf.float32)
    got = raised(mode, pfb.py_function, func, x, tf.float32)
    # TF's py_function says InvalidArgument for these.
    assert type(want) is tf.errors.InvalidArgumentError
    assert isinstance(got, type(want))
    assert phrase in str(got)


def test_unsupported_array_function_result_is_internal():
    with pytest.raises(tf.errors.InternalError, match="Unsupported numpy data type"):
        run("tf.function", lambda f, i, T: pfb.array_function(f, i, T, framework="numpy"),
            UNSUPPORTED["structured"][0], tf.constant([1.0]), tf.float32)


def test_bfloat16_result_is_still_supported():
    """ml_dtypes' bfloat16 is a 'V'-kind NumPy dtype that TF has a dtype for."""
    out = run("tf.function", pfb.numpy_function,
              lambda a: np.ones(2, ml_dtypes.bfloat16), tf.constant([1.0]), tf.bfloat16)
    assert out.dtype == tf.bfloat16 and out.numpy().tolist() == [1.0, 1.0]


# No value, or a value NumPy reads as numbers where Tout declares a string:
# TF's class is InvalidArgument in graphs ("returns 0 values, but expects to
# see 1 values"; "0-th value returned by pyfunc_1 is uint8, but expects
# string"), not the InternalError of a result without a tensor form.
WRONG_RESULTS = {
    "None": (lambda a: None, tf.float32, "returned None (0 values)"),
    "None for a string": (lambda a: None, tf.string, "returned None (0 values)"),
    "None for two": (lambda a: None, [tf.float32, tf.float32], "returned None (0 values)"),
    "bytearray": (lambda a: bytearray(b"ab"), tf.string, "a bytearray, which NumPy reads"),
    "memoryview": (lambda a: memoryview(b"ab"), tf.string, "a memoryview, which NumPy reads"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", ALL_APIS)
@pytest.mark.parametrize("what", WRONG_RESULTS)
def test_no_value_or_bytes_like_for_a_string_raise_tfs_class(mode, api_name, what):
    tf_api, pfb_api = ALL_APIS[api_name]
    func, Tout, phrase = WRONG_RESULTS[what]
    x = tf.constant([1.0])
    got = raised(mode, pfb_api, func, x, Tout)
    assert type(got) is tf.errors.InvalidArgumentError, got
    if api_name != "py_function":
        assert phrase in str(got)
        if what in ("bytearray", "memoryview"):
            assert "return bytes(value)" in str(got)
    if mode == "eager" and api_name != "py_function":
        # TF's eager numpy_function checks nothing; pfb raises the graph's class.
        return
    want = raised(mode, tf_api, func, x, Tout)
    assert type(got) is type(want), (want, got)


# ---------------------------------------------------------------------------
# 6. Error texts.

TF_DTYPE_PHRASE = re.compile(r"Cannot convert .* to a TensorFlow DType\.")


def _bad_tout_error(api, Tout, graph):
    with pytest.raises(TypeError) as info:
        if graph:
            with tf.Graph().as_default():
                api(lambda a: a, [tf.constant([1.0])], Tout)
        else:
            api(lambda a: a, [tf.constant([1.0])], Tout)
    return info.value


@pytest.mark.parametrize("Tout,index", [("foo", "Tout"), ([tf.float32, object()], "Tout[1]")],
                         ids=["single", "list"])
@pytest.mark.parametrize("api_name", ALL_APIS)
def test_bad_tout_says_what_tf_says(api_name, Tout, index):
    tf_api, pfb_api = ALL_APIS[api_name]
    want = _bad_tout_error(tf_api, Tout, graph=True)
    assert TF_DTYPE_PHRASE.search(str(want))
    for graph in (True, False):
        got = _bad_tout_error(pfb_api, Tout, graph)
        assert TF_DTYPE_PHRASE.search(str(got))
        assert str(got).startswith(index + ":")
        assert "tf.TensorSpec" in str(got)  # what it must be instead


TF_MISMATCH_PHRASE = re.compile(
    r"py_function: func=.* returned .*, which did not match Tout=\[.*RaggedTensorSpec", re.S)

COMPOSITE_MISMATCHES = {
    "dense for ragged": lambda a: a,
    "wrong ragged dtype": lambda a: tf.RaggedTensor.from_row_lengths(
        tf.cast(a, tf.float32), [1, 2]),
    "two for one": lambda a: [a, a],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", COMPOSITE_MISMATCHES)
def test_composite_tout_mismatch_says_what_tf_says(mode, case):
    spec = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)
    func = COMPOSITE_MISMATCHES[case]
    x = tf.constant([1, 2, 3])
    want = raised(mode, tf.py_function, func, x, spec)
    got = raised(mode, pfb.py_function, func, x, spec)
    assert type(want) is tf.errors.InvalidArgumentError
    assert isinstance(got, type(want))
    assert TF_MISMATCH_PHRASE.search(str(want))
    assert TF_MISMATCH_PHRASE.search(str(got))


@pytest.mark.parametrize("module", ["_errors", "_op"])
def test_error_module_examples_run(module):
    """The error class and the one not-callable check (_op.check_callable)."""
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"pyfunc_bridge.{module}"),
                             optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_scalar_string_input_in_graph_still_counts_as_converted():
    """Statistics: a 0-d string reaches the function as bytes, still counted."""
    previous = pfb.enable_stats(True)
    try:
        pfb.reset_stats()

        @tf.function
        def f(s):
            return pfb.numpy_function(lambda b: b, [s], tf.string, name="scalar_string")
        assert f(tf.constant("abcd")).numpy() == b"abcd"
        entry = pfb.stats().functions["scalar_string"]
        assert entry.calls == 1
        assert entry.bytes_copied["string"] == 8  # 4 in, 4 out
    finally:
        pfb.enable_stats(previous)
        pfb.reset_stats()


# ---------------------------------------------------------------------------
# 7. Inputs that do not convert to a tensor.

NOT_CONVERTIBLE = {"None": None, "ragged list": [[1], [1, 2]], "mixed list": [1, None],
                   "dict": {"a": 1}}


def _input_error(api, value, graph):
    def build():
        return api(lambda *a: np.float32(1), [tf.constant(1.0), value], tf.float32)
    with pytest.raises(Exception) as info:
        if graph == "tf.function":
            tf.function(build)()
        elif graph == "graph":
            with tf.Graph().as_default():
                build()
        else:
            build()
    return info.value


@pytest.mark.parametrize("graph", ["tf.function", "graph"])
@pytest.mark.parametrize("api_name", ALL_APIS)
@pytest.mark.parametrize("what", NOT_CONVERTIBLE)
def test_input_that_does_not_convert_raises_tfs_class(what, api_name, graph):
    """In a graph TF's op builder raises TypeError ("... have types [<NOT
    CONVERTIBLE TO TENSOR>] that are invalid"), also for the values whose
    conversion raises ValueError (None, a ragged list); so does pfb."""
    tf_api, pfb_api = ALL_APIS[api_name]
    want = _input_error(tf_api, NOT_CONVERTIBLE[what], graph)
    got = _input_error(pfb_api, NOT_CONVERTIBLE[what], graph)
    assert type(want) is TypeError
    assert type(got) is TypeError


@pytest.mark.parametrize("what", ["None", "ragged list"])
def test_eager_py_function_input_that_does_not_convert_stays_a_value_error(what):
    """Eagerly TF's py_function raises the conversion's ValueError; so does pfb."""
    want = _input_error(tf.py_function, NOT_CONVERTIBLE[what], "eager")
    got = _input_error(pfb.py_function, NOT_CONVERTIBLE[what], "eager")
    assert type(want) is type(got) is ValueError
