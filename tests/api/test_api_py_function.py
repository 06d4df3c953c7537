"""The public op layer: pfb.py_function against tf.py_function: results,
dtypes, zero-copy EagerTensor inputs, the decorator and Tout forms.

The contract every API shares (modes, Tout, counts, shapes, exceptions,
argument errors, lifetimes) is in test_api_contract.py; py_function's
outputs and errors in test_api_py_function_outputs.py, its gradient in
test_api_py_function_gradients.py."""
import json

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import address, assert_same as _assert_same
from fresh_python import fresh_python

OP = "PyfuncBridge>PyFunction"
X = tf.constant([0.5, -1.0, 2.0, 3.0])


def _is_eager_tensor(value):
    return isinstance(value, tf.Tensor) and hasattr(value, "numpy")


# --------------------------------------------------------------------------
# Results (the modes every API shares are in test_api_contract.py).

def _numpy(result):
    if isinstance(result, (list, tuple)):
        return [np.asarray(t) for t in result]
    return np.asarray(result)


def test_session_in_a_fresh_process():
    # A TF1 program that never ran an eager op before its Session: the function
    # still gets EagerTensors (tf.py_function manages this too).
    proc = fresh_python("api/py_function_session_in_a_fresh_process.py", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT [3.0, 8.0]" in proc.stdout


def inner_times_ten(x):
    return x * 10


def outer_calls_inner(x):
    return pfb.py_function(inner_times_ten, [x], tf.float32) + 1


def test_nested_eager_calls_run_their_own_functions():
    # The eager op's kernel is cached by TF and its calls share one key: the
    # inner call ran the outer function (still alive) again, recursing until
    # the error could not be formatted.
    assert float(pfb.py_function(outer_calls_inner, [tf.constant(1.0)], tf.float32)) == 11.0
    assert float(pfb.py_function(inner_times_ten, [tf.constant(2.0)], tf.float32)) == 20.0


def test_string_inputs_in_a_tf1_session_match_tf():
    # A TF1 program runs its Session's kernels in graph mode: string inputs
    # must still become EagerTensors (made inside the function's eager
    # context), on the first call and every later one, as with tf.py_function.
    proc = fresh_python("api/py_function_string_inputs_in_a_tf1_session.py", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert runs == [[[2, 3], [2.0, 4.0], [2, 3], [2.0, 4.0]]] * 2


# --------------------------------------------------------------------------
# Dtypes in and out.

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32,
          tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.complex64,
          tf.complex128, tf.string]


def _sample(dtype):
    if dtype == tf.string:
        return tf.constant([b"ab", b"", b"x\x00y", "h\u00e9".encode()])
    if dtype == tf.bool:
        return tf.constant([True, False, True, True])
    if dtype.is_complex:
        return tf.constant([1 + 2j, -3j, 0.5, 4], dtype)
    if dtype.is_unsigned:
        return tf.constant([0, 1, 7, dtype.max], dtype)
    if dtype.is_integer:
        return tf.constant([dtype.min, -1, 7, dtype.max], dtype)
    return tf.cast(tf.constant([0.5, -1.25, 3.0, 100.0]), dtype)


@pytest.mark.parametrize("returns", ["tensor", "ndarray"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
def test_dtype_round_trip(dtype, returns):
    x = _sample(dtype)
    seen = []

    def func(a):
        seen.append((_is_eager_tensor(a), a.dtype, a.shape))
        return tf.identity(a) if returns == "tensor" else a.numpy()

    y = pfb.py_function(func, [x], dtype)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert seen[0] == (True, dtype, x.shape)
    ref = tf.py_function(func, [x], dtype)
    np.testing.assert_array_equal(y.numpy(), ref.numpy())


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16, tf.complex64, tf.complex128,
                                   tf.int8, tf.uint16, tf.bool, tf.string],
                         ids=lambda d: d.name)
def test_dtype_computed_in_tf_function(dtype):
    x = _sample(dtype)

    def double(a):
        if dtype == tf.string:
            return tf.strings.join([a, a])
        if dtype == tf.bool:
            return tf.logical_not(a)
        return a + a

    f = tf.function(lambda v: pfb.py_function(double, [v], dtype))
    np.testing.assert_array_equal(f(x).numpy(), double(x).numpy())


def test_strings_from_python_values():
    y = pfb.py_function(lambda s: [v.decode().upper() + "\u00e9" for v in s.numpy()],
                        [tf.constant(["ab", "c"])], [tf.string, tf.string])
    assert [t.numpy() for t in y] == ["AB\u00e9".encode(), "C\u00e9".encode()]
    obj = pfb.py_function(lambda s: np.array([b"\x00raw", b"z"], dtype=object),
                          [tf.constant(["q"])], tf.string)
    assert obj.numpy().tolist() == [b"\x00raw", b"z"]


def test_mixed_input_dtypes():
    def func(s, i, b, c):
        return tf.strings.length(s) + i, tf.where(b, tf.math.real(c), -1.0)

    s = tf.constant(["a", "bbb"])
    i = tf.constant([10, 20])
    b = tf.constant([True, False])
    c = tf.constant([1 + 1j, 2 + 2j], tf.complex128)
    got = pfb.py_function(func, [s, i, b, c], [tf.int32, tf.float64])
    want = tf.py_function(func, [s, i, b, c], [tf.int32, tf.float64])
    _assert_same(_numpy(got), _numpy(want))


# --------------------------------------------------------------------------
# The function's arguments: EagerTensors viewing the op's inputs.

def test_receives_eager_tensors_in_every_mode():
    seen = []

    def func(a):
        seen.append((_is_eager_tensor(a), tf.executing_eagerly()))
        return a + 1

    pfb.py_function(func, [X], tf.float32)
    tf.function(lambda x: pfb.py_function(func, [x], tf.float32))(X)
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [None])
        y = pfb.py_function(func, [p], tf.float32)
        with tf.compat.v1.Session() as sess:
            sess.run(y, {p: [1.0]})
    list(tf.data.Dataset.from_tensors(X).map(
        lambda x: pfb.py_function(func, [x], tf.float32)))
    assert seen == [(True, True)] * 4


def _big():
    return tf.constant(np.arange(4096, dtype=np.float32))


def test_eager_input_is_zero_copy():
    x = _big()
    seen = []

    def func(a):
        seen.append(address(a))
        return a * 2

    pfb.py_function(func, [x], tf.float32)
    assert seen == [address(x)]


def test_tf_function_input_is_zero_copy():
    x = _big()
    seen = []

    def func(a):
        seen.append(address(a))
        return a * 2

    tf.function(lambda v: pfb.py_function(func, [v], tf.float32))(x)
    assert seen == [address(x)]


def test_dlpack_view_of_input_is_zero_copy():
    x = _big()
    seen = []

    def func(a):
        b = tf.experimental.dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(a))
        seen.append(address(b))
        return a

    pfb.py_function(func, [x], tf.float32)
    assert seen == [address(x)]


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_identity_output_shares_the_input_memory(mode):
    x = _big()
    if mode == "eager":
        y = pfb.py_function(lambda a: a, [x], tf.float32)
    else:
        y = tf.function(lambda v: pfb.py_function(lambda a: a, [v], tf.float32))(x)
    assert address(y) == address(x)
    np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_computed_output_is_new_memory():
    x = _big()
    y = pfb.py_function(lambda a: a * 2, [x], tf.float32)
    assert not np.shares_memory(np.asarray(y), np.asarray(x))
    np.testing.assert_array_equal(y.numpy(), x.numpy() * 2)


# --------------------------------------------------------------------------
# Decorator and Tout forms.

def test_decorator_eager_and_tf_function():
    @pfb.py_function(Tout=tf.float32)
    def scaled(a, b):
        return a * b

    np.testing.assert_array_equal(scaled(X, tf.constant(2.0)).numpy(), X.numpy() * 2)
    assert scaled.__name__ == "scaled"

    @tf.function
    def f(x):
        y = scaled(x, tf.constant(3.0))
        assert y.op.type == OP
        return y

    np.testing.assert_array_equal(f(X).numpy(), X.numpy() * 3)


def test_single_tout_returns_a_tensor():
    y = pfb.py_function(lambda a: a, [X], tf.float32)
    assert isinstance(y, tf.Tensor)


@pytest.mark.parametrize("Tout", [[tf.float32], (tf.float32,)], ids=["list", "tuple"])
def test_one_element_list_tout_returns_a_list(Tout):
    y = pfb.py_function(lambda a: [a], [X], Tout)
    assert isinstance(y, list) and len(y) == 1
    np.testing.assert_array_equal(y[0].numpy(), X.numpy())


def test_bare_value_for_one_element_list_tout():
    # As tf.py_function and pfb.numpy_function: a bare value is the one output.
    got = pfb.py_function(lambda a: a * 2, [X], [tf.float32])
    want = tf.py_function(lambda a: a * 2, [X], [tf.float32])
    _assert_same(_numpy(got), _numpy(want))


def test_one_element_list_for_single_tout():
    # As tf.py_function and pfb.numpy_function: a list holds one value per output.
    got = pfb.py_function(lambda a: [a * 2], [X], tf.float32)
    want = tf.py_function(lambda a: [a * 2], [X], tf.float32)
    _assert_same(_numpy(got), _numpy(want))


@pytest.mark.parametrize("Tout", [[], ()], ids=["empty_list", "empty_tuple"])
@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_no_outputs_runs_the_function(Tout, mode):
    calls = []

    def side_effect(a):
        calls.append(float(tf.reduce_sum(a)))

    # As tf.py_function: [] eagerly, the Operation in a graph.
    if mode == "eager":
        assert pfb.py_function(side_effect, [X], Tout) == []
    else:
        @tf.function
        def f(x):
            assert isinstance(pfb.py_function(side_effect, [x], Tout), tf.Operation)
            return x + 1

        f(X)
    assert calls == [float(tf.reduce_sum(X))]


def test_no_inputs():
    assert float(pfb.py_function(lambda: 2.5, [], tf.float32)) == 2.5


@pytest.mark.parametrize("kwargs", [dict(inp=None, Tout=tf.float64), dict(inp=[], Tout=None)],
                         ids=["no inp", "no Tout"])
def test_inp_and_tout_are_required_as_tf_requires_them(kwargs):
    for api in (tf.py_function, pfb.py_function):  # TF's is the oracle
        with pytest.raises(TypeError, match=r"Missing (required )?argument"):
            api(lambda: 2.5, **kwargs)
        with pytest.raises(TypeError, match=r"Missing (required )?argument"):
            tf.function(lambda: api(lambda: 2.5, **kwargs))()


def test_unsupported_tout_is_type_error():
    with pytest.raises(TypeError, match="qint8"):
        pfb.py_function(lambda a: a, [X], tf.qint8)
    with pytest.raises(TypeError, match="RaggedTensorSpec"):
        pfb.py_function(lambda a: a, [X], tf.TensorArraySpec([2], tf.float32))

