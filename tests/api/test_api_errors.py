"""Errors raised by the function, against TensorFlow's builtins: NUL bytes in
messages, and the exceptions that eager calls re-raise as they are."""
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import API_PAIRS, error_of, raising

NUL_MESSAGE = "bad value\0 in row 7"
# TF's status messages end at a NUL byte on their way to Python: the bridge
# writes it as \x00 and keeps the rest.
NUL_SHOWN = "bad value\\x00 in row 7"


# ------------------------------------------------------------- NUL bytes --

@pytest.mark.parametrize("op", sorted(API_PAIRS))
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_nul_byte_keeps_the_whole_message_and_the_traceback(op, mode, eager_path):
    def func(a):
        raise ValueError(NUL_MESSAGE)
    err = error_of(API_PAIRS[op][0], func, mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert NUL_SHOWN in err.message
    assert "Traceback (most recent call last)" in err.message
    assert "in func" in err.message
    # TensorFlow's messages (but eagerly numpy_function re-raises the
    # ValueError itself) keep the traceback and lose the text after the NUL.
    theirs = error_of(API_PAIRS[op][1], func, mode)
    assert "bad value" in str(theirs)


def test_a_nul_byte_is_written_out_in_the_status_the_kernel_gets(api, registered):
    import dlpack_ctypes as dl
    key = registered(raising(ValueError(NUL_MESSAGE)))
    code, message, _ = dl.call(api, key, [], [])
    assert code == 3
    assert NUL_SHOWN in message and "Traceback" in message


# ----------------------------------------- exceptions re-raised as they are --

class Interrupt(KeyboardInterrupt):
    pass


EXCEPTIONS = {
    "SystemExit": lambda: SystemExit(7),
    "KeyboardInterrupt": lambda: Interrupt("stop"),
    "NotFoundError": lambda: tf.errors.NotFoundError(None, None, "no such thing"),
    "AbortedError": lambda: tf.errors.AbortedError(None, None, "aborted"),
}


@pytest.mark.parametrize("kind", sorted(EXCEPTIONS))
@pytest.mark.parametrize("op", sorted(API_PAIRS))
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_error_class_is_tensorflows(kind, op, mode, eager_path):
    ours, theirs = API_PAIRS[op]
    expected = type(error_of(theirs, raising(EXCEPTIONS[kind]()), mode))
    exc = EXCEPTIONS[kind]()
    got = error_of(ours, raising(exc), mode)
    assert type(got) is expected
    if expected is type(exc):
        assert got is exc  # the very exception, as TensorFlow re-raises it
    else:
        assert type(exc).__name__ in got.message and "Traceback" in got.message


def test_system_exit_leaves_an_eager_numpy_function_with_its_code(eager_path):
    with pytest.raises(SystemExit) as info:
        pfb.numpy_function(lambda a: exit(3), [tf.constant(1.0)], tf.float32)
    assert info.value.code == 3


def test_an_exception_re_raised_once_is_not_raised_again(eager_path):
    with pytest.raises(tf.errors.NotFoundError):
        pfb.numpy_function(raising(tf.errors.NotFoundError(None, None, "x")),
                           [tf.constant(1.0)], tf.float32)
    # The next failing call reports its own error.
    with pytest.raises(tf.errors.InvalidArgumentError, match="second"):
        pfb.numpy_function(raising(ValueError("second")), [tf.constant(1.0)], tf.float32)


def test_nested_eager_calls_re_raise_the_inner_exception_through_the_outer():
    def outer(a):
        return pfb.numpy_function(raising(Interrupt("inner")), [a], tf.float32)
    with pytest.raises(Interrupt, match="inner"):
        pfb.numpy_function(lambda a: outer(tf.constant(a)), [tf.constant(1.0)], tf.float32)
