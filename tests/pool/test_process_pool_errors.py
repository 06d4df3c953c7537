"""Process workers: errors of a call (unpicklable results, unloadable
replies, exceptions with the worker's traceback, autograph-converted
functions) and of the arguments (executor, pool, closed pools)."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
import pyfunc_bridge as pfb
from process_pool_helpers import call_in_thread, marked_pid, run_script
from process_pool_helpers import marks, pool  # noqa: F401 (fixtures)


@pytest.mark.parametrize("func, index", [(pf.returns_a_lambda, 0),
                                         (pf.returns_an_array_and_a_lambda, 1)])
def test_a_result_that_does_not_pickle_fails_its_call_only(func, index):
    with pfb.ProcessPool(1, name="pickle pool") as one:
        before = one.pids()
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"result {index} of the function \\(a function\\) cannot be "
                                 f"sent back from the worker process"):
            pfb.numpy_function(func, [tf.constant([1, 2])], [tf.int32] * (index + 1),
                               executor=one)
        assert one.pids() == before  # the worker lives on
        y = pfb.numpy_function(pf.double, [tf.constant([1, 2])], tf.int32, executor=one)
        assert y.numpy().tolist() == [2, 4]


@pytest.mark.parametrize("func, Tout", [(pf.returns_none, tf.float32),
                                        (pf.returns_a_bytearray, tf.string),
                                        (pf.returns_a_bytes_memoryview, tf.string)])
def test_no_value_or_bytes_like_for_a_string_is_tfs_class_in_a_worker_too(pool, func, Tout):
    """TF's class (InvalidArgument in a graph), eagerly and in a graph, in
    the caller's process or a worker's."""
    x = tf.constant([1.0])
    with pytest.raises(tf.errors.OpError) as info:
        tf.function(lambda: tf.numpy_function(func, [x], Tout))()
    want = type(info.value)
    assert want is tf.errors.InvalidArgumentError
    for executor in (None, pool):
        call = lambda: pfb.numpy_function(func, [x], Tout, executor=executor)
        for run in (call, tf.function(call)):
            with pytest.raises(tf.errors.OpError) as info:
                run()
            assert type(info.value) is want, (executor, info.value)


# Hangs (in a subprocess, then) where the reader thread dies on the reply.
_UNLOADABLE_REPLY_SCRIPT = "pool/errors_unloadable_reply.py"


def test_a_reply_this_process_cannot_load_fails_the_call_and_the_pool_recovers():
    run_script(_UNLOADABLE_REPLY_SCRIPT)


@pytest.mark.parametrize("func, tf_error, name, marker", [
    (pf.raises_value_error, tf.errors.InvalidArgumentError, "ValueError",
     "bad value from the worker"),
    (pf.raises_key_error, tf.errors.UnknownError, "KeyError", "missing key in the worker"),
    (pf.raises_unpicklable, tf.errors.UnknownError, "Unpicklable", "one and two"),
])
def test_exceptions_map_to_tf_errors_with_the_worker_traceback(pool, func, tf_error, name,
                                                               marker):
    run = tf.function(lambda x: pfb.numpy_function(func, [x], tf.int64, executor=pool))
    with pytest.raises(tf_error) as info:
        run(tf.constant(1, tf.int64))
    message = info.value.message
    assert marker in message and name in message
    assert "the traceback in the worker process" in message
    assert "process_functions.py" in message and f"in {func.__name__}" in message


def _autograph_map(executor, offset):
    """A map function whose functions are defined inside it: tf.data
    converts them with autograph (a nested def with a default and a branch,
    and lambdas, one closing over `offset`)."""
    def map_fn(i):
        def inner(a, k=3.0):
            if a > 1:
                return np.sqrt(a) + offset
            return a * k
        y = pfb.numpy_function(inner, [tf.cast(i, tf.float64)], tf.float64, executor=executor)
        z = pfb.numpy_function(lambda b: np.abs(b) + offset, [y], tf.float64,
                               executor=executor)
        return pfb.numpy_function(lambda a: np.sqrt(a), [z], tf.float64, executor=executor)
    return map_fn


def test_functions_autograph_converted_run_in_a_worker_as_written():
    """tf.data converts the map function, and every function defined inside
    it, with autograph: the worker receives the functions as written (the
    converted ones name TensorFlow's autograph, which a worker has not)."""
    with pfb.ProcessPool(1, name="autograph pool") as one:
        in_process = tf.data.Dataset.range(6).map(_autograph_map(None, 2.0))
        in_worker = tf.data.Dataset.range(6).map(_autograph_map(one, 2.0))
        np.testing.assert_array_equal(list(in_worker.as_numpy_iterator()),
                                      list(in_process.as_numpy_iterator()))
        # The example: an inline lambda that calls something.
        dataset = tf.data.Dataset.range(4).map(lambda i: pfb.numpy_function(
            lambda a: np.sqrt(a), [tf.cast(i, tf.float64)], tf.float64, executor=one))
        np.testing.assert_array_equal(list(dataset.as_numpy_iterator()), np.sqrt(np.arange(4)))
        # An error's traceback names this file, not autograph's generated one.
        failing = tf.data.Dataset.range(1).map(lambda i: pfb.numpy_function(
            lambda a: np.asarray(int("not a number")), [i], tf.int64, executor=one))
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            list(failing)
        message = info.value.message  # whole, where an assertion fails (pytest would elide it)
        assert os.path.basename(__file__) in message, message  # this file
        assert "__autograph_generated" not in message, message
        assert not pfb.numpy_function(pf.tensorflow_imported, [0], tf.bool, executor=one)


def test_py_function_refuses_an_executor(pool):
    for executor in (pool, "process"):
        with pytest.raises(ValueError, match="py_function takes no executor.*EagerTensors"):
            pfb.py_function(pf.identity, [tf.constant(1)], tf.int32, executor=executor)


@pytest.mark.parametrize("executor", ["threads", 2, object()])
def test_executor_arguments_are_checked(executor):
    with pytest.raises(ValueError, match="executor must be None.*ProcessPool"):
        pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=executor)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0}, "workers must be a positive int"),
    ({"workers": "2"}, "workers must be a positive int"),
    ({"arena_bytes": -1}, "arena_bytes must be a non-negative int"),
])
def test_pool_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pfb.ProcessPool(**kwargs)


def closed_text(name, how="is closed"):
    """The words of every call on the closed pool `name`: the pool, that it
    is closed, and what to do."""
    return (f"pyfunc_bridge: ProcessPool '{name}' {how}.*: a closed pool runs no more calls. "
            f"Pass an open ProcessPool as executor=")


def test_every_call_on_a_closed_pool_fails_the_same_way():
    closed = pfb.ProcessPool(1, name="closed pool")
    before = tf.function(lambda x: pfb.numpy_function(pf.identity, [x], tf.int32,
                                                      executor=closed))
    assert int(before(tf.constant(4))) == 4  # a graph (and its kernel's route) made while open
    closed.close()
    closed.close()  # idempotent
    calls = {
        "eager": lambda: pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32,
                                            executor=closed),
        "array_function": lambda: pfb.array_function(pf.identity, [tf.constant(1)], tf.int32,
                                                     framework="numpy", executor=closed),
        "a graph made before": lambda: before(tf.constant(4)),
        "a graph made after": lambda: tf.function(lambda x: pfb.numpy_function(
            pf.identity, [x], tf.int32, executor=closed))(tf.constant(1)),
        "tf.data": lambda: list(tf.data.Dataset.range(2).map(lambda i: pfb.numpy_function(
            pf.identity, [i], tf.int64, executor=closed))),
    }
    for how, call in calls.items():
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            call()
        assert re.search(closed_text("closed pool"), info.value.message), (how, info.value)
        # Only the pool's words: TF logs a failed map's message (at exit too).
        assert "Traceback" not in info.value.message, (how, info.value.message)


def test_a_call_that_a_close_meets_fails_as_one_on_a_closed_pool(marks):
    closing = pfb.ProcessPool(1, name="closing pool")
    thread, box = call_in_thread(pf.hang, 30.0, closing)
    held_by = marked_pid(marks)  # the call runs in the worker
    closing.close()  # (which ends the worker after its grace)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), tf.errors.FailedPreconditionError), box
    how = f"was closed while worker process {held_by} held the call"
    assert re.search(closed_text("closing pool", how), box["error"].message), box["error"]
    assert "Traceback" not in box["error"].message, box["error"].message


def test_a_function_that_fails_to_load_raises_the_same_error_and_keeps_no_input():
    """Each call raises the loading error with the same traceback (it does
    not grow by a call each time), and its input blocks go back."""
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="failed load pool") as pool:
        full = pool.free_input_bytes
        x = tf.constant(np.ones(65536, np.float32))  # 256 KiB: an input block
        func = pf.LoadedBy(pf.fail_to_load)
        graph = tf.function(lambda x: pfb.numpy_function(func, [x], tf.float32,
                                                         executor=pool))
        messages = []
        for call in (graph, graph, graph,
                     lambda x: pfb.numpy_function(func, [x], tf.float32, executor=pool)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="this function cannot be loaded") as info:
                call(x)
            messages.append(info.value.message)
        assert messages[1] == messages[2], messages
        assert "fail_to_load" in messages[2]  # the loading frames stay
        wait_for(lambda: pool.free_input_bytes == full)
        assert float(pfb.numpy_function(pf.double, [tf.constant(2.0)], tf.float32,
                                        executor=pool)) == 4.0
