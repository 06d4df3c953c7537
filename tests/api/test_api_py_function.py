"""The public op layer: pfb.py_function against tf.py_function, its errors,
composite tensors, zero-copy inputs and its once-differentiable gradient.

The contract every API shares (modes, Tout, counts, shapes, exceptions,
argument errors, lifetimes) is in test_api_contract.py."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import record

import pyfunc_bridge as pfb
from conftest import address, assert_same as _assert_same, py_function_gradient

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
    code = textwrap.dedent("""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf
        import pyfunc_bridge as pfb
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None])
            y = pfb.py_function(lambda a: a * 2, [x], tf.float32)
            with tf.compat.v1.Session() as sess:
                print("RESULT", sess.run(y, {x: [1.5, 4.0]}).tolist())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
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
    code = textwrap.dedent("""
        import json, os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf
        import pyfunc_bridge as pfb
        tf.compat.v1.disable_eager_execution()

        def f(s, x):
            return [tf.strings.length(s), x * 2]

        s = tf.constant(["ab", "cde"])
        x = tf.constant([1.0, 2.0])
        ours = pfb.py_function(f, [s, x], [tf.int32, tf.float32])
        theirs = tf.py_function(f, [s, x], [tf.int32, tf.float32])
        with tf.compat.v1.Session() as sess:
            runs = [[v.tolist() for v in sess.run(ours + theirs)] for _ in range(2)]
        print("RESULT", json.dumps(runs))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
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


@pytest.mark.parametrize("Tout", [[], None], ids=["empty_list", "none"])
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
    assert float(pfb.py_function(lambda: 2.5, None, tf.float64)) == 2.5


def test_unsupported_tout_is_type_error():
    with pytest.raises(TypeError, match="qint8"):
        pfb.py_function(lambda a: a, [X], tf.qint8)
    with pytest.raises(TypeError, match="RaggedTensorSpec"):
        pfb.py_function(lambda a: a, [X], tf.TensorArraySpec([2], tf.float32))


# --------------------------------------------------------------------------
# Run-time errors about what the function returned.

def _run_error(func, Tout, inputs=None, mode="eager"):
    """Runs the op and returns the OpError it raised."""
    inputs = [X] if inputs is None else inputs
    if mode == "eager":
        with pytest.raises(tf.errors.OpError) as info:
            pfb.py_function(func, inputs, Tout)
    else:
        @tf.function
        def f(*xs):
            result = pfb.py_function(func, list(xs), Tout)
            # No outputs: the Operation, which runs by automatic control dependencies.
            return None if isinstance(result, tf.Operation) else result

        with pytest.raises(tf.errors.OpError) as info:
            f(*inputs)
    return info.value


MODES = ["eager", "tf_function"]


@pytest.mark.parametrize("mode", MODES)
def test_dtype_mismatch_tensor(mode):
    err = _run_error(lambda a: (a, tf.cast(a, tf.float64)), [tf.float32, tf.float32],
                     mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 1" in err.message
    assert "float32" in err.message and "float64" in err.message


def test_dtype_mismatch_ndarray():
    err = _run_error(lambda a: a.numpy().astype(np.int16), tf.float32)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 0" in err.message
    assert "float32" in err.message and "int16" in err.message


def test_python_float_for_int32_is_error():
    err = _run_error(lambda a: 2.5, tf.int32)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int32" in err.message


# --------------------------------------------------------------------------
# Composite outputs and inputs.

RAGGED = tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)
SPARSE = tf.SparseTensorSpec([None, None], tf.float32)


def _split(a):
    return tf.RaggedTensor.from_row_lengths(a, [1, 3])


def _sparse(a):
    return tf.sparse.from_dense(tf.reshape(a, [2, 2]) * tf.constant([[1.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("mode", MODES)
def test_ragged_output(mode):
    if mode == "eager":
        y = pfb.py_function(_split, [X], RAGGED)
    else:
        @tf.function
        def f(x):
            r = pfb.py_function(_split, [x], RAGGED)
            assert isinstance(r, tf.RaggedTensor)
            return r.row_lengths(), r.flat_values

        lengths, values = f(X)
        y = tf.RaggedTensor.from_row_lengths(values, lengths)
    assert isinstance(y, tf.RaggedTensor)
    assert y.to_list() == _split(X).to_list()


@pytest.mark.parametrize("mode", MODES)
def test_sparse_output(mode):
    if mode == "eager":
        y = pfb.py_function(_sparse, [X], SPARSE)
    else:
        @tf.function
        def f(x):
            s = pfb.py_function(_sparse, [x], SPARSE)
            assert isinstance(s, tf.SparseTensor)
            return s.indices, s.values, s.dense_shape

        y = tf.SparseTensor(*f(X))
    assert isinstance(y, tf.SparseTensor)
    want = _sparse(X)
    np.testing.assert_array_equal(y.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(y.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(y.dense_shape.numpy(), want.dense_shape.numpy())


def test_composite_and_dense_outputs_together():
    d, r, s = pfb.py_function(lambda a: (a * 2, _split(a), _sparse(a)), [X],
                              [tf.float32, RAGGED, SPARSE])
    np.testing.assert_array_equal(d.numpy(), X.numpy() * 2)
    assert r.to_list() == _split(X).to_list()
    np.testing.assert_array_equal(tf.sparse.to_dense(s).numpy(),
                                  tf.sparse.to_dense(_sparse(X)).numpy())


def test_composite_output_in_session():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [4])
        r = pfb.py_function(_split, [p], RAGGED)
        with tf.compat.v1.Session() as sess:
            got = sess.run(r, {p: X.numpy()})
    assert got.to_list() == _split(X).to_list()


@pytest.mark.parametrize("mode", MODES)
def test_composite_inputs(mode):
    ragged = tf.ragged.constant([[1, 2], [3], []])
    sparse = tf.sparse.from_dense(tf.constant([[0, 5], [7, 0]]))
    seen = []

    def func(r, d, s):
        seen.append((type(r), type(d), type(s)))
        return (tf.reduce_sum(r, axis=1) + d,
                tf.sparse.to_dense(s) * 2,
                r * 10)

    Tout = [tf.int32, tf.int32, tf.RaggedTensorSpec([3, None], tf.int32, ragged_rank=1)]
    dense = tf.constant([100, 200, 300])
    if mode == "eager":
        a, b, c = pfb.py_function(func, [ragged, dense, sparse], Tout)
    else:
        @tf.function
        def f(r, d, s):
            a, b, c = pfb.py_function(func, [r, d, s], Tout)
            return a, b, c.flat_values, c.row_splits

        a, b, values, splits = f(ragged, dense, sparse)
        c = tf.RaggedTensor.from_row_splits(values, splits)
    assert seen == [(tf.RaggedTensor, type(dense), tf.SparseTensor)]
    assert a.numpy().tolist() == [103, 203, 300]
    assert b.numpy().tolist() == [[0, 10], [14, 0]]
    assert c.to_list() == [[10, 20], [30], []]


@pytest.mark.parametrize("returned,Tout,words", [
    (lambda a: a, RAGGED, ["output 0", "RaggedTensor"]),
    (_split, tf.float32, ["output 0", "RaggedTensor", "dense"]),
    (lambda a: tf.RaggedTensor.from_row_lengths(tf.cast(a, tf.int32), [1, 3]), RAGGED,
     ["output 0", "int32", "float32"]),
    (lambda a: tf.RaggedTensor.from_row_lengths(a, [1, 3]),
     tf.RaggedTensorSpec([None, None, None], tf.float32, ragged_rank=2),
     ["output 0", "ragged_rank"]),
    (lambda a: tf.reshape(a, [2, 2]), SPARSE, ["output 0", "SparseTensor"]),
    (_split, SPARSE, ["output 0", "SparseTensor"]),
    (lambda a: (a, _sparse(a)), [tf.float32, tf.float32], ["output 1", "SparseTensor"]),
], ids=["dense_for_ragged", "ragged_for_dense", "ragged_dtype", "ragged_rank",
        "dense_for_sparse", "ragged_for_sparse", "sparse_for_dense_1"])
@pytest.mark.parametrize("mode", MODES)
def test_composite_mismatch(mode, returned, Tout, words):
    err = _run_error(returned, Tout, mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    for word in words:
        assert word in err.message


# --------------------------------------------------------------------------
# Python exceptions -> TF error classes, with the traceback.

def test_tf_error_inside_the_function_maps_like_tf():
    # A TF OpError raised by the function is "anything else" in the table, as in
    # tf.py_function; the message keeps TF's text and the traceback.
    def bad_reshape(a):
        return tf.reshape(a, [3])

    err = _run_error(bad_reshape, tf.float32)
    with pytest.raises(tf.errors.OpError) as ref:
        tf.py_function(bad_reshape, [X], tf.float32)
    assert type(err) is type(ref.value) is tf.errors.UnknownError
    assert "bad_reshape" in err.message
    assert "reshape" in err.message and "InvalidArgumentError" in err.message


# --------------------------------------------------------------------------
# Gradients against the numerical Jacobian of the same function.

def _elementwise(a):
    return tf.sin(a) * a


def _matmul(a, b):
    return tf.matmul(a, b)


def _with_int(a, k):
    return a * tf.cast(k, a.dtype) ** 2 + tf.exp(a)


def _numpy_square(a):
    return a.numpy() ** 2


def _two_outputs(a):
    return tf.exp(a), a * a * a


_rng = np.random.default_rng(7)

# name -> (func, inputs, Tout, used output index or None for a single output)
GRAD_CASES = {
    "elementwise": (_elementwise, [_rng.normal(size=[5])], tf.float64, None),
    "matmul": (_matmul, [_rng.normal(size=[2, 3]), _rng.normal(size=[3, 4])], tf.float64,
               None),
    "int_input": (_with_int, [_rng.normal(size=[4]), np.array(3, np.int32)], tf.float64, None),
    "numpy_result": (_numpy_square, [_rng.normal(size=[3])], tf.float64, None),
    "one_of_two_outputs": (_two_outputs, [_rng.normal(size=[4])], [tf.float64, tf.float64], 1),
}


def _used(outputs, used):
    return outputs if used is None else outputs[used]


def _float_positions(inputs):
    return [i for i, v in enumerate(inputs) if v.dtype.kind == "f"]


def _expected_gradients(case):
    """d(sum(w * output))/d(float input), from tf.test.compute_gradient's
    numerical Jacobian; zeros where the function returns a NumPy array."""
    func, inputs, Tout, used = GRAD_CASES[case]
    positions = _float_positions(inputs)
    out = _used(pfb.py_function(func, [tf.constant(v) for v in inputs], Tout), used)
    weights = np.linspace(0.5, 1.5, out.shape.num_elements()).reshape(out.shape)
    if case == "numpy_result":  # the op's TF computation does not involve the input
        return weights, [np.zeros_like(inputs[i]) for i in positions]

    def of_floats(*floats):
        full = list(inputs)
        for i, v in zip(positions, floats):
            full[i] = v
        full = [tf.convert_to_tensor(v) for v in full]
        return _used(pfb.py_function(func, full, Tout), used)

    _, numerical = tf.test.compute_gradient(of_floats, [inputs[i] for i in positions])
    return weights, [(jac.T @ weights.ravel()).reshape(inputs[i].shape)
                     for jac, i in zip(numerical, positions)]


def _check_gradients(case, grads, weights_expected):
    weights, expected = weights_expected
    _, inputs, _, _ = GRAD_CASES[case]
    positions = _float_positions(inputs)
    for i, grad in enumerate(grads):
        if i not in positions:
            assert grad is None  # integer input
    got = [grads[i] for i in positions]
    assert all(g is not None for g in got)
    for g, want in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def expected_gradients():
    return {case: _expected_gradients(case) for case in GRAD_CASES}


def test_expected_gradients_are_meaningful(expected_gradients):
    for case, (_, expected) in expected_gradients.items():
        norm = sum(float(np.abs(e).sum()) for e in expected)
        assert (norm == 0) == (case == "numpy_result"), case


# A NumPy result is not a function of the op's TF computation: its gradient is
# zero (checked below), not its numerical derivative.
@pytest.mark.parametrize("case", sorted(set(GRAD_CASES) - {"numpy_result"}))
def test_eager_tape_full_jacobian(case):
    func, inputs, Tout, used = GRAD_CASES[case]
    positions = _float_positions(inputs)

    def of_floats(*floats):
        full = list(inputs)
        for i, v in zip(positions, floats):
            full[i] = v
        return _used(pfb.py_function(func, [tf.convert_to_tensor(v) for v in full], Tout),
                     used)

    theoretical, numerical = tf.test.compute_gradient(of_floats,
                                                      [inputs[i] for i in positions])
    for t, n in zip(theoretical, numerical):
        assert np.abs(n).sum() > 0
        np.testing.assert_allclose(t, n, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_eager_gradient_tape(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    xs = [tf.constant(v) for v in inputs]
    with tf.GradientTape() as tape:
        for x in xs:
            if x.dtype.is_floating:
                tape.watch(x)
        loss = tf.reduce_sum(_used(pfb.py_function(func, xs, Tout), used) * weights)
    grads = tape.gradient(loss, xs)
    _check_gradients(case, grads, expected_gradients[case])


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_tf_function_gradient_tape(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    positions = _float_positions(inputs)

    @tf.function
    def grads_of(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                if x.dtype.is_floating:
                    tape.watch(x)
            loss = tf.reduce_sum(_used(pfb.py_function(func, list(xs), Tout), used) * weights)
        grads = tape.gradient(loss, list(xs))
        return [g for i, g in enumerate(grads) if i in positions], [
            g is None for i, g in enumerate(grads) if i not in positions]

    got, int_none = grads_of(*[tf.constant(v) for v in inputs])
    assert all(int_none)
    full = [None] * len(inputs)
    for i, g in zip(positions, got):
        full[i] = g
    _check_gradients(case, full, expected_gradients[case])


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_session_tf_gradients(case, expected_gradients):
    func, inputs, Tout, used = GRAD_CASES[case]
    weights = expected_gradients[case][0]
    positions = _float_positions(inputs)
    with tf.Graph().as_default():
        xs = [tf.compat.v1.placeholder(tf.as_dtype(v.dtype), v.shape) for v in inputs]
        loss = tf.reduce_sum(_used(pfb.py_function(func, xs, Tout), used) * weights)
        grads = tf.gradients(loss, xs)
        for i, g in enumerate(grads):
            if i not in positions:
                assert g is None
        with tf.compat.v1.Session() as sess:
            feed = dict(zip(xs, inputs))
            got = sess.run([grads[i] for i in positions], feed)
            again = sess.run([grads[i] for i in positions], feed)  # one forward per run
    full = [None] * len(inputs)
    for i, g in zip(positions, got):
        full[i] = g
    _check_gradients(case, full, expected_gradients[case])
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a, b)


def test_session_gradients_follow_each_feed():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float64, [None])
        y = pfb.py_function(lambda a: a ** 3, [p], tf.float64)
        (g,) = tf.gradients(y, p)
        with tf.compat.v1.Session() as sess:
            for n in range(1, 6):
                v = np.arange(n, dtype=np.float64) - 1.5
                np.testing.assert_allclose(sess.run(g, {p: v}), 3 * v ** 2)


def test_persistent_tape_gradient_twice():
    x = tf.constant([0.3, -2.0, 1.5], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        u, v = pfb.py_function(_two_outputs, [x], [tf.float64, tf.float64])
    first = tape.gradient(v, x)
    second = tape.gradient(v, x)
    of_u = tape.gradient(u, x)
    both = tape.gradient([u, v], x)
    del tape
    np.testing.assert_allclose(first.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_array_equal(second.numpy(), first.numpy())
    np.testing.assert_allclose(of_u.numpy(), np.exp(x.numpy()))
    np.testing.assert_allclose(both.numpy(), np.exp(x.numpy()) + 3 * x.numpy() ** 2)


def test_gradient_through_a_variable():
    v = tf.Variable([1.0, -2.0, 0.5])
    with tf.GradientTape() as tape:
        y = pfb.py_function(lambda a: tf.reduce_sum(a * a), [v], tf.float32)
    np.testing.assert_allclose(tape.gradient(y, v).numpy(), 2 * v.numpy())


def test_gradient_matches_tf_py_function():
    x = tf.constant([0.2, 0.7, -1.1], tf.float64)
    grads = []
    for api in (pfb.py_function, tf.py_function):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = api(_elementwise, [x], tf.float64)
        grads.append(tape.gradient(y, x).numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_gradient_of_function_using_a_captured_variable():
    # The function's own TF computation is recorded, including its inputs only.
    w = tf.Variable(3.0, dtype=tf.float64)
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(lambda a: a * w, [x], tf.float64)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [3.0, 3.0])


# --------------------------------------------------------------------------
# Second-order gradients are not defined: they fail loudly, not with None.

def _square(a):
    return a * a


_LOUD = (LookupError, tf.errors.OpError)


def test_second_order_eager_fails_loudly():
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = pfb.py_function(_square, [x], tf.float64)
        gx = inner.gradient(y, x)
    np.testing.assert_allclose(gx.numpy(), [2.0, 4.0])  # first order works
    with pytest.raises(_LOUD, match="(?i)differentiab|gradient"):
        outer.gradient(gx, x)


def test_second_order_tf_gradients_fails_loudly():
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float64, [2])
        y = pfb.py_function(_square, [p], tf.float64)
        (g,) = tf.gradients(y, p)
        with pytest.raises(_LOUD, match="(?i)differentiab|gradient"):
            tf.gradients(g, p)


# --------------------------------------------------------------------------
# Gradient state is recorded only when a gradient can run.

def _recording_probe():
    flags = []

    def func(a):
        flags.append(record.could_possibly_record())
        return a * a

    return flags, func


def test_eager_without_tape_records_nothing():
    flags, func = _recording_probe()
    pfb.py_function(func, [X], tf.float32)
    assert flags == [False]


def test_eager_under_watching_tape_records():
    flags, func = _recording_probe()
    with tf.GradientTape() as tape:
        tape.watch(X)
        y = pfb.py_function(func, [X], tf.float32)
    assert flags == [True]
    np.testing.assert_allclose(tape.gradient(y, X).numpy(), 2 * X.numpy())


def test_inference_tf_function_records_nothing():
    flags, func = _recording_probe()
    f = tf.function(lambda x: pfb.py_function(func, [x], tf.float32))
    f(X)
    f(X + 1)
    assert flags == [False, False]


def test_tf_data_map_without_gradient_records_nothing():
    flags, func = _recording_probe()
    ds = tf.data.Dataset.range(3).map(
        lambda i: pfb.py_function(func, [tf.cast(i, tf.float32)], tf.float32))
    assert [float(v) for v in ds] == [0.0, 1.0, 4.0]
    assert flags == [False, False, False]


def test_tf_function_taking_gradient_records():
    flags, func = _recording_probe()
    np.testing.assert_allclose(py_function_gradient(func)(X).numpy(), 2 * X.numpy())
    assert flags == [True]


def test_session_records_only_with_gradient_wired():
    flags, func = _recording_probe()
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.float32, [None])
        y = pfb.py_function(func, [p], tf.float32)
        with tf.compat.v1.Session() as sess:
            sess.run(y, {p: [1.0]})
            (g,) = tf.gradients(y, p)
            assert sess.run(g, {p: [1.5]}).tolist() == [3.0]
    assert flags == [False, True]
