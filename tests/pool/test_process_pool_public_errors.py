"""The pool's errors by their public names (pfb.WorkerError,
pfb.CallTimeoutError, pfb.PoolClosedError, defined in pyfunc_bridge/pool/errors.py):
an eager call raises each as itself and as its TensorFlow error, so code
written for either catches it; a graph raises the TensorFlow error, which
names the class."""
import pickle

import pytest
import tensorflow as tf

import process_functions as pf
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import errors

PUBLIC = {"WorkerError": tf.errors.UnknownError,
          "CallTimeoutError": tf.errors.DeadlineExceededError,
          "PoolClosedError": tf.errors.FailedPreconditionError}


@pytest.mark.parametrize("name", PUBLIC)
def test_the_pool_errors_are_public_and_pickle_as_themselves(name):
    cls = getattr(pfb, name)
    assert cls is getattr(errors, name) and name in pfb.__all__ and name in dir(pfb)
    # By reference to the module that defines it, which imports no TensorFlow.
    back = pickle.loads(pickle.dumps(cls("the message")))
    assert type(back) is cls and back.args == ("the message",)


def test_a_worker_that_exits_raises_worker_error():
    with pfb.ProcessPool(1, name="public errors pool") as pool:
        with pytest.raises(pfb.WorkerError, match="exited with status 3") as info:
            pfb.numpy_function(pf.exits, [tf.constant(3)], tf.int32, executor=pool)
        assert isinstance(info.value, tf.errors.UnknownError)
        graph = tf.function(lambda x: pfb.numpy_function(pf.exits, [x], tf.int32,
                                                         executor=pool))
        with pytest.raises(tf.errors.UnknownError,
                           match="pyfunc_bridge.pool.errors.WorkerError: .*exited with status 4"):
            graph(tf.constant(4))


def test_a_call_past_the_timeout_raises_call_timeout_error():
    with pfb.ProcessPool(1, name="public timeout pool", timeout=0.5) as pool:
        with pytest.raises(pfb.CallTimeoutError, match="ran past the 0.5 s timeout") as info:
            pfb.numpy_function(pf.hang, [tf.constant(60.0)], tf.float32, executor=pool)
        assert isinstance(info.value, tf.errors.DeadlineExceededError)
        assert isinstance(info.value, TimeoutError)


def test_a_call_on_a_closed_pool_raises_pool_closed_error():
    pool = pfb.ProcessPool(1, name="public closed pool")
    pool.close()
    for api in (pfb.numpy_function, pfb.py_func):
        with pytest.raises(pfb.PoolClosedError, match="'public closed pool' is closed") as info:
            api(pf.double, [tf.constant(1)], tf.int32, executor=pool)
        assert isinstance(info.value, tf.errors.FailedPreconditionError)
    with pytest.raises(tf.errors.FailedPreconditionError, match="PoolClosedError"):
        tf.function(lambda x: pfb.numpy_function(pf.double, [x], tf.int32,
                                                 executor=pool))(tf.constant(1))


@pytest.mark.parametrize("name", PUBLIC)
def test_a_pool_error_has_one_code_on_every_path(name):
    # A native call the dispatcher fails gets errors.error_code (Supervisor's
    # _detach), a Python call the conversion layer's table: the same rows.
    from pyfunc_bridge import _library
    error = getattr(pfb, name)("the message")
    code = PUBLIC[name](None, None, "").error_code
    assert errors.error_code(error) == _library.conversion().error_code(error) == code
