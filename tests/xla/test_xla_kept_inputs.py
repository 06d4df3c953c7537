"""What a function keeps of its inputs under XLA stays valid: XLA reuses its
buffers once a custom call returns, so the function is given memory pfb owns
(design.md, "The life of a call under XLA").  Each test keeps inputs in a way
real code does, runs 50 more XLA calls that reuse XLA's buffers, and then
reads what it kept; TF's values without XLA are the oracle."""
import threading

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from xla_helpers import jit, run_script

N = 8
SPEC = tf.TensorSpec([N], tf.float32)
MORE_CALLS = 50


def _numpy_api(func, inp, Tout):
    return pfb.numpy_function(func, inp, Tout)


def _py_func_api(func, inp, Tout):
    return pfb.py_func(func, inp, Tout)


def _array_api(func, inp, Tout):
    return pfb.array_function(func, inp, Tout, framework="numpy")


def _py_function_api(func, inp, Tout):
    return pfb.py_function(func, inp, Tout)


APIS = {"numpy_function": _numpy_api, "py_func": _py_func_api,
        "array_function": _array_api, "py_function": _py_function_api}
# How a function keeps what it was given (py_function's are EagerTensors).
KEEPS = {"numpy_function": ["global", "memoryview"], "py_func": ["global", "memoryview"],
         "array_function": ["global", "memoryview"],
         "py_function": ["global", "identity"]}
CASES = [(api, how) for api, hows in KEEPS.items() for how in hows]


def _kept(how, a):
    if how == "memoryview":
        return memoryview(a)
    if how == "identity":
        return tf.identity(a)
    return a


def _values(kept):
    return np.array(kept.numpy() if isinstance(kept, tf.Tensor) else np.asarray(kept))


def _input(i):
    return tf.range(N, dtype=tf.float32) + 100.0 * i


def _run_more(f, start=1):
    """Calls `f` MORE_CALLS times on other values: XLA reuses its buffers."""
    for i in range(start, start + MORE_CALLS):
        np.testing.assert_array_equal(f(_input(i)).numpy(), _input(i).numpy() + 1)


def _check_kept(kept, first=0):
    assert len(kept) > 0
    for i, value in enumerate(kept, start=first):
        np.testing.assert_array_equal(_values(value), _input(i).numpy())


@pytest.mark.parametrize("api, how", CASES, ids=[f"{a}-{h}" for a, h in CASES])
def test_a_kept_input_keeps_its_values(api, how):
    kept = []

    def keep(a):
        kept.append(_kept(how, a))
        return a + 1

    f = jit(lambda x: APIS[api](keep, [x], SPEC))
    np.testing.assert_array_equal(f(_input(0)).numpy(), _input(0).numpy() + 1)
    _run_more(f)
    assert len(kept) == 1 + MORE_CALLS
    _check_kept(kept)


@pytest.mark.parametrize("api", list(APIS))
def test_an_input_a_thread_reads_later_keeps_its_values(api):
    go, read, threads = threading.Event(), [], []

    def hand_off(a):
        if not threads:  # the first call's input, read after 50 more calls
            def later():
                go.wait(timeout=300)
                read.append(_values(a))
            threads.append(threading.Thread(target=later, daemon=True))
            threads[0].start()
        return a + 1

    f = jit(lambda x: APIS[api](hand_off, [x], SPEC))
    f(_input(0))
    _run_more(f)
    go.set()
    threads[0].join(timeout=300)
    assert not threads[0].is_alive()
    np.testing.assert_array_equal(read[0], _input(0).numpy())


@pytest.mark.parametrize("api", list(APIS))
def test_a_function_that_keeps_its_input_and_raises(api):
    kept, raising = [], [True]

    def keep_then_raise(a):
        kept.append(a)
        if raising[0]:
            raise ValueError("kept, then raised")
        return a + 1

    f = jit(lambda x: APIS[api](keep_then_raise, [x], SPEC))
    with pytest.raises(tf.errors.OpError, match="kept, then raised"):
        f(_input(0))
    raising[0] = False
    _run_more(f)
    _check_kept(kept)


def test_inputs_kept_by_the_gradient_rerun_keep_their_values():
    """The gradient custom call reruns the forward function: what that rerun
    keeps is as valid as what the forward call keeps."""
    kept = []

    def cube(x):
        kept.append(x)
        return x * x * x

    @jit
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(cube, [x], SPEC)
        return tape.gradient(y, x)

    for i in range(MORE_CALLS):
        np.testing.assert_allclose(grad(_input(i)).numpy(), 3 * _input(i).numpy() ** 2)
    assert len(kept) == 2 * MORE_CALLS  # the forward call and its rerun
    for i in range(MORE_CALLS):
        for value in kept[2 * i:2 * i + 2]:
            np.testing.assert_array_equal(value.numpy(), _input(i).numpy())


def test_inputs_kept_in_forward_mode_keep_their_values():
    """tf.autodiff.ForwardAccumulator runs the function again in a call of
    its own (the JVP), which keeps its inputs too."""
    kept = []

    def square(x):
        kept.append(x)
        return x * x

    @jit
    def jvp(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            y = pfb.py_function(square, [x], SPEC)
        return acc.jvp(y)

    for i in range(MORE_CALLS):
        np.testing.assert_allclose(jvp(_input(i)).numpy(), 2 * _input(i).numpy())
    assert len(kept) == 2 * MORE_CALLS  # the forward call and the JVP's
    for value in kept:
        # Each kept input is one of the inputs, unchanged (a row of _input).
        i = int(value.numpy()[0] // 100)
        np.testing.assert_array_equal(value.numpy(), _input(i).numpy())


def test_a_large_kept_input_reads_back_in_a_fresh_process():
    """8 M floats: reading a freed XLA buffer of this size crashed."""
    lines = run_script("xla/kept_inputs_large_kept_input.py")
    assert lines[-1] == "True"
