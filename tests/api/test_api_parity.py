"""Drop-in parity: TensorFlow's builtins and pfb's ops, side by side.

Each test runs TF's function (the oracle) and pfb's the same way, in every
mode where it applies (eager, tf.function, a parallel tf.data map, a TF1 graph
run by a Session), and asserts that they agree on what the function receives
(type, dtype, shape), what the caller gets back, and the error class.  Where
pfb deliberately differs, the test pins the difference the README lists.
The harness is api_helpers.py's; sections 4 to 6 (a func that is not
callable, results without a tensor form, error texts) are in
test_api_parity_errors.py.
"""
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from api_helpers import ALL_APIS, MODES, NUMPY_APIS, received, run


# ---------------------------------------------------------------------------
# 1. 0-d inputs: NumPy scalars (bytes for strings) in graphs, 0-d arrays eagerly.

SCALARS = [
    (tf.float32, 1.5), (tf.float16, 1.5), (tf.bfloat16, 1.5), (tf.float64, 1.5),
    (tf.int8, -3), (tf.int16, -300), (tf.int32, 7), (tf.int64, 1 << 40), (tf.uint8, 200),
    (tf.uint16, 60000), (tf.uint32, 1 << 31), (tf.uint64, 1 << 63), (tf.bool, True),
    (tf.complex64, 1 + 2j),
    (tf.complex128, 1 - 2j), (tf.string, "abc"),
]
SCALAR_IDS = [dtype.name for dtype, _ in SCALARS]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
@pytest.mark.parametrize("dtype,value", SCALARS, ids=SCALAR_IDS)
def test_scalar_input_arrives_as_tf_hands_it_over(mode, api_name, dtype, value):
    tf_api, pfb_api = NUMPY_APIS[api_name]
    x = tf.constant(value, dtype)
    got = received(mode, pfb_api, x, dtype)
    if mode == "eager" and dtype == tf.bfloat16:
        # TF's eager numpy_function cannot make an ndarray of a bfloat16
        # tensor; pfb hands over the 0-d array (README: deliberate differences).
        with pytest.raises(ValueError):
            received(mode, tf_api, x, dtype)
        assert got == (np.ndarray, np.dtype(ml_dtypes.bfloat16), ())
        return
    want = received(mode, tf_api, x, dtype)
    assert got == want
    if mode == "eager":
        assert got[0] is np.ndarray and got[2] == ()
    elif dtype == tf.string:
        assert got[0] is bytes
    else:
        assert issubclass(got[0], np.generic)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype,value", [(tf.float32, 1.5), (tf.bool, True), (tf.string, "abc")],
                         ids=["float32", "bool", "string"])
def test_py_function_scalar_input_is_an_eager_tensor_as_in_tf(mode, dtype, value):
    x = tf.constant(value, dtype)
    got = received(mode, pfb.py_function, x, dtype)
    assert got == received(mode, tf.py_function, x, dtype)
    assert got[0] is type(x) and got[1] == dtype and got[2] == ()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_scalar_results_match(mode, api_name):
    tf_api, pfb_api = NUMPY_APIS[api_name]
    x = tf.constant(2.5, tf.float32)
    want = run(mode, tf_api, lambda a: a * 2, x, tf.float32)
    got = run(mode, pfb_api, lambda a: a * 2, x, tf.float32)
    assert np.asarray(got).dtype == np.asarray(want).dtype == np.float32
    assert np.asarray(got).shape == np.asarray(want).shape == ()
    assert float(got) == float(want) == 5.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
@pytest.mark.parametrize("dtype,value", [(tf.float32, [1.5, 2.5]), (tf.string, [["a"], ["b"]])],
                         ids=["float32", "string"])
def test_arrays_of_rank_one_and_more_stay_arrays(mode, api_name, dtype, value):
    tf_api, pfb_api = NUMPY_APIS[api_name]
    x = tf.constant(value, dtype)
    got = received(mode, pfb_api, x, dtype)
    assert got == received(mode, tf_api, x, dtype)
    assert got[0] is np.ndarray and got[2] == tuple(x.shape)


def test_scalar_input_in_graph_is_a_copy_and_not_a_view():
    """Scalars are values, as TF's: nothing of TF's memory is reachable."""
    seen = []

    @tf.function
    def f(x):
        return pfb.numpy_function(lambda a: seen.append(a) or a, [x], tf.float32)
    f(tf.constant(4.0))
    (scalar,) = seen
    assert type(scalar) is np.float32 and scalar == 4.0
    assert not isinstance(scalar, np.ndarray)


def test_scalar_input_with_copy_true_is_still_a_scalar():
    @tf.function
    def f(x):
        return pfb.numpy_function(lambda a: np.float32(type(a) is np.float32), [x],
                                  tf.float32, copy=True)
    assert float(f(tf.constant(1.0))) == 1.0


def test_filename_map_decodes_bytes_like_tf():
    """The usual pipeline: file names in, decoded strings out."""
    names = tf.constant(["a.txt", "b.txt"])
    outputs = {}
    for label, api in (("tf", tf.numpy_function), ("pfb", pfb.numpy_function)):
        ds = tf.data.Dataset.from_tensor_slices(names).map(
            lambda p: api(lambda s: s.decode().upper(), [p], tf.string),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        outputs[label] = list(ds.as_numpy_iterator())
    assert outputs["pfb"] == outputs["tf"] == [b"A.TXT", b"B.TXT"]


@pytest.mark.parametrize("mode", MODES)
def test_array_function_numpy_follows_numpy_function(mode):
    """framework="numpy" is numpy_function under another name: the same scalar
    rule (torch and JAX hand over their 0-d arrays: they have no scalar type)."""
    def numpy_array_function(func, inp, Tout):
        return pfb.array_function(func, inp, Tout, framework="numpy")
    for x in (tf.constant(1.0), tf.constant("abc")):
        got = received(mode, numpy_array_function, x, x.dtype)
        assert got == received(mode, pfb.numpy_function, x, x.dtype)
        assert got == received(mode, tf.numpy_function, x, x.dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_string_dtype_result_converts_where_tf_has_no_numpy_type(mode, api_name):
    """NumPy 2's StringDType for Tout=tf.string: TF's numpy_function fails
    ("Unsupported numpy type: not a numpy type"), its py_function converts it;
    pfb converts it in every API, as it does 'U' arrays (README: deliberate
    differences)."""
    tf_api, pfb_api = NUMPY_APIS[api_name]
    func = lambda a: np.array(["h\u00e9", "a\x00b"], dtype=np.dtypes.StringDType())
    x = tf.constant(1.0)
    with pytest.raises((tf.errors.InternalError, ValueError), match="not a numpy type"):
        run(mode, tf_api, func, x, tf.string)
    got = np.asarray(run(mode, pfb_api, func, x, tf.string))
    assert got.tolist() == ["h\u00e9".encode(), b"a\x00b"]


# ---------------------------------------------------------------------------
# 2. Eager 0-d string input.

@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_eager_scalar_string_round_trips_like_tf(api_name):
    tf_api, pfb_api = NUMPY_APIS[api_name]
    x = tf.constant("abc")
    got = pfb_api(lambda s: s, [x], tf.string)
    want = tf_api(lambda s: s, [x], tf.string)
    assert got.dtype == want.dtype == tf.string
    assert got.shape == want.shape == ()
    assert got.numpy() == want.numpy() == b"abc"
    assert received("eager", pfb_api, x, tf.string) == received("eager", tf_api, x, tf.string)


# ---------------------------------------------------------------------------
# 3. No outputs.

@pytest.mark.parametrize("api_name", ALL_APIS)
def test_no_outputs_eagerly_returns_what_tf_returns(api_name):
    tf_api, pfb_api = ALL_APIS[api_name]
    calls = []
    x = tf.constant([1.0])
    want = tf_api(lambda a: calls.append("tf"), [x], [])
    got = pfb_api(lambda a: calls.append("pfb"), [x], [])
    assert got == want
    assert type(got) is type(want)  # None for numpy_function/py_func, [] for py_function
    assert calls == ["tf", "pfb"]


@pytest.mark.parametrize("api_name", ALL_APIS)
def test_no_outputs_in_session_is_an_operation_to_run(api_name):
    results = {}
    for label, api in zip(("tf", "pfb"), ALL_APIS[api_name]):
        calls = []
        with tf.Graph().as_default():
            x = tf.constant([1.0])
            op = api(lambda a: calls.append(a.shape), [x], [])
            with tf.control_dependencies([op]):
                y = tf.identity(x)
            with tf.compat.v1.Session() as sess:
                ran = sess.run(op)
                value = sess.run(y)
        results[label] = (type(op), ran, value.tolist(), len(calls))
    assert results["pfb"] == results["tf"] == (tf.Operation, None, [1.0], 2)


@pytest.mark.parametrize("api_name", ALL_APIS)
def test_no_outputs_in_tf_function_is_an_operation(api_name):
    results = {}
    for label, api in zip(("tf", "pfb"), ALL_APIS[api_name]):
        calls = []

        @tf.function
        def f(x):
            op = api(lambda a: calls.append(1), [x], [])
            results[label] = type(op)
            with tf.control_dependencies([op]):
                return tf.identity(x)
        assert f(tf.constant([2.0])).numpy().tolist() == [2.0]
        assert calls == [1]
    assert results["pfb"] is results["tf"] is tf.Operation


@pytest.mark.parametrize("api_name", ALL_APIS)
def test_no_outputs_in_parallel_map_runs_for_each_element(api_name):
    counts = {}
    for label, api in zip(("tf", "pfb"), ALL_APIS[api_name]):
        calls = []

        def element(x):
            op = api(lambda a: calls.append(1), [x], [])
            with tf.control_dependencies([op]):
                return tf.identity(x)
        ds = tf.data.Dataset.range(5).map(element, num_parallel_calls=2)
        counts[label] = (sorted(ds.as_numpy_iterator()), len(calls))
    assert counts["pfb"] == counts["tf"] == ([0, 1, 2, 3, 4], 5)


# The APIs that take `stateful`, with TF's builtin as the oracle
# (array_function(framework="numpy") is exactly numpy_function).
STATEFUL_APIS = {
    **NUMPY_APIS,
    "array_function": (tf.numpy_function,
                       lambda *args, **kwargs: pfb.array_function(*args, framework="numpy",
                                                                  **kwargs)),
}


def _stateless_no_outputs(mode, api, calls):
    """What api(f, [x], [], stateful=False) gives the caller in `mode`, and
    what running it gives ("-" where nothing is run apart from the call)."""
    def f(a):
        calls.append(1)
    if mode == "eager":
        return api(f, [tf.constant([1.0])], [], stateful=False), "-"
    if mode == "tf.function":
        built = []

        @tf.function
        def g(x):
            built.append(api(f, [x], [], stateful=False))
            return tf.identity(x)
        g(tf.constant([1.0]))
        return built[0], "-"
    if mode == "tf.data":
        built = []

        def element(x):
            built.append(api(f, [x], [], stateful=False))
            return x
        ds = tf.data.Dataset.range(3).map(element, num_parallel_calls=2)
        return built[0], sorted(ds.as_numpy_iterator())
    with tf.Graph().as_default():
        op = api(f, [tf.constant([1.0])], [], stateful=False)
        with tf.compat.v1.Session() as sess:
            return op, sess.run(op)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api_name", STATEFUL_APIS)
def test_stateless_no_outputs_matches_tf(api_name, mode):
    """Tout=[] with stateful=False: TF's generated wrapper of a stateless op
    returns its (empty) output list, not the Operation; nothing keeps such an
    op, so graphs prune it and the function never runs there."""
    results = {}
    for label, api in zip(("tf", "pfb"), STATEFUL_APIS[api_name]):
        calls = []
        got, ran = _stateless_no_outputs(mode, api, calls)
        results[label] = (type(got).__name__, got if not isinstance(got, tf.Operation) else "op",
                          ran, len(calls))
    assert results["pfb"] == results["tf"]
    if mode == "eager":
        assert results["tf"] == ("NoneType", None, "-", 1)
    elif mode == "session":
        assert results["tf"] == ("list", [], [], 0)



@pytest.mark.parametrize("mode", ["tf.function", "session"])
@pytest.mark.parametrize("api_name", NUMPY_APIS)
def test_non_ascii_str_array_result_is_utf8_where_tf_fails(mode, api_name):
    """A 'U' array of non-ASCII text for Tout=tf.string: TF's numpy_function
    encodes it as ASCII and fails; pfb encodes it as UTF-8, as both encode a
    str scalar (README: deliberate differences)."""
    tf_api, pfb_api = NUMPY_APIS[api_name]
    func = lambda a: np.array(["h\u00e9", "\U0001F600"])
    x = tf.constant(1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="UnicodeEncodeError"):
        run(mode, tf_api, func, x, tf.string)
    got = run(mode, pfb_api, func, x, tf.string)
    assert np.asarray(got).tolist() == ["h\u00e9".encode(), "\U0001F600".encode()]
    assert run(mode, tf_api, lambda a: "h\u00e9", x, tf.string) == "h\u00e9".encode()


@pytest.mark.parametrize("api", ["numpy_function", "py_func"])
def test_a_one_entry_tout_list_gives_tf_structure_in_each_mode(api):
    """Eagerly TF's numpy_function and py_func return a tensor for
    Tout=[dtype]; in a graph a list of one: pfb's the same."""
    ours, theirs = getattr(pfb, api), {"numpy_function": tf.numpy_function,
                                      "py_func": tf.compat.v1.py_func}[api]
    x = tf.constant(1.0)
    for run in (lambda f: f(lambda a: a * 2, [x], [tf.float32]),
                lambda f: tf.function(lambda: f(lambda a: a * 2, [x], [tf.float32]))()):
        got, want = run(ours), run(theirs)
        assert type(got) is type(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
