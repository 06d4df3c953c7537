"""The bridge ops inside XLA: errors. An exception reaches the caller with
its traceback and TF class, a wrong result is the usual error, what XLA
cannot take fails at compile time, and an input kept past the call is an
error; stateful calls are neither merged nor dropped, dependent ones run in
order."""
import re

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from xla_helpers import hlo, jit


def test_exception_reaches_the_caller_with_its_traceback():
    def boom(a):
        raise ValueError("boom from inside XLA")

    f = jit(lambda x: pfb.numpy_function(boom, [x], tf.TensorSpec([2], tf.float32)))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        f(tf.constant([1.0, 2.0]))
    message = str(info.value)
    assert "ValueError: boom from inside XLA" in message
    assert "in boom" in message  # the traceback's frame


def _errors_with_and_without_xla(func):
    """The errors of a numpy_function of `func` on a float32[2], in a plain
    tf.function and under jit_compile=True, which must be of one class."""
    spec = tf.TensorSpec([2], tf.float32)
    x = tf.constant([1.0, 2.0])
    f = lambda x: pfb.numpy_function(func, [x], spec)  # noqa: E731
    with pytest.raises(tf.errors.OpError) as plain:
        tf.function(f)(x)
    with pytest.raises(tf.errors.OpError) as compiled:
        jit(f)(x)
    assert type(compiled.value) is type(plain.value)
    return plain.value, compiled.value


def test_exception_class_maps_as_without_xla():
    def missing(a):
        raise KeyError("k")

    _errors_with_and_without_xla(missing)


@pytest.mark.parametrize("result, words", [
    (lambda a: a.astype(np.float64), "float64"),
    (lambda a: np.zeros([3], np.float32), "shape"),
    (lambda a: np.zeros([2, 1], np.float32), "shape"),
])
def test_wrong_result_is_the_usual_error(result, words):
    plain, compiled = _errors_with_and_without_xla(result)
    assert words in str(compiled)
    # The bridge's own words, as without XLA.
    words = re.search(r"pyfunc_bridge: [^\[\n]*", str(plain)).group(0).strip()
    assert words in str(compiled)


@pytest.mark.parametrize("Tout, words", [
    (tf.float32, "declares no shape"),
    (tf.TensorSpec(None, tf.float32), "declares no shape"),
    (tf.TensorSpec([None], tf.float32), "unknown dimensions"),
])
def test_undeclared_shape_fails_at_compile_time(Tout, words):
    calls = []

    def fn(a):
        calls.append(1)
        return a

    f = jit(lambda x: pfb.numpy_function(fn, [x], Tout, name="undeclared"))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        f(tf.constant([1.0, 2.0]))
    message = str(info.value)
    assert words in message
    assert "undeclared" in message  # the node
    assert "Tout=tf.TensorSpec(shape, dtype)" in message
    assert calls == []  # never ran: compiling failed


def test_strings_are_refused_at_compile_time():
    f = jit(lambda s: pfb.numpy_function(lambda a: a, [s], tf.TensorSpec([1], tf.string)))
    with pytest.raises(tf.errors.OpError, match="XLA_CPU_JIT|string"):
        f(tf.constant(["a"]))


def test_an_input_released_just_after_the_call_by_another_thread_is_no_error():
    """JAX computes asynchronously and drops its hold on an input's buffer on
    its own thread just after the result is ready: a hold let go within a
    moment of the return is no kept reference."""
    import threading
    handed = []

    def hand_off(a):
        held = threading.Event()

        def hold(view):
            held.set()
            threading.Event().wait(0.02)  # still held after the call returned
            del view
        thread = threading.Thread(target=hold, args=(a,))
        handed.append(thread)
        del a
        thread.start()
        held.wait()
        return np.ones(2, np.float32)

    f = jit(lambda x: pfb.numpy_function(hand_off, [x], tf.TensorSpec([2], tf.float32)))
    for _ in range(5):
        np.testing.assert_array_equal(f(tf.constant([1.0, 2.0])).numpy(), [1, 1])
    for thread in handed:
        thread.join()


# ------------------------------------------------------------ side effects --

def test_stateful_calls_are_neither_merged_nor_dropped():
    count = []

    def tick(a):
        count.append(1)
        return a

    spec = tf.TensorSpec([2], tf.float32)

    @jit
    def f(x):
        pfb.numpy_function(tick, [x], spec)  # result unused
        a = pfb.numpy_function(tick, [x], spec)
        b = pfb.numpy_function(tick, [x], spec)  # equal to `a`'s call
        return a + b

    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(f(x).numpy(), [2, 4])
    assert len(count) == 3
    f(x)
    assert len(count) == 6
    assert hlo(f, x).count('custom_call_target="pyfunc_bridge.call"') == 3


def test_dependent_calls_run_in_order():
    order = []

    def step(name):
        def fn(a):
            order.append(name)
            return a + 1
        return fn

    spec = tf.TensorSpec([], tf.int32)

    @jit
    def f(x):
        a = pfb.numpy_function(step("first"), [x], spec)
        b = pfb.numpy_function(step("second"), [a], spec)
        return pfb.numpy_function(step("third"), [b * 2], spec)

    assert f(tf.constant(1)).numpy() == 7
    assert order == ["first", "second", "third"]
