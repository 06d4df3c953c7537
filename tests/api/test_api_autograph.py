"""Functions that autograph converted (pyfunc_bridge/_autograph.py): what a
worker process or a graph's pickle receives is the function as written.
tf.function converts the traced function from this file's source, and every
function defined inside it."""
import pickle

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api as autograph_api

import pyfunc_bridge as pfb
from pyfunc_bridge import _autograph
from pyfunc_bridge.pool.pickling import pickle_function


def converted_functions(build, *args):
    """The functions `build` (traced by tf.function) hands to numpy_function."""
    seen = []

    def record(func):
        seen.append(func)
        return func
    tf.function(lambda *a: build(record, *a))(*args)
    assert seen and all(_autograph.converted(f) for f in seen)  # autograph did convert
    return seen


def test_lambdas_alike_on_one_line_each_come_back_as_written():
    k = 3.0
    funcs = converted_functions(lambda record, x: (
        pfb.numpy_function(record(lambda a: a + 1), [x], tf.float32),
        pfb.numpy_function(record(lambda a: a * k), [x], tf.float32),
        pfb.numpy_function(record(lambda: np.float32(7) if k > 2 else np.float32(0)), [],
                           tf.float32)), tf.constant(2.0))
    users = [_autograph.user_function(f) for f in funcs]
    assert [u(np.float32(2)) for u in users[:2]] + [users[2]()] == [3.0, 6.0, 7.0]
    for user in users:
        assert not _autograph.converted(user)
        assert user.__code__.co_filename == __file__
        assert "ag__" not in user.__code__.co_freevars


def test_a_nested_def_keeps_its_defaults_closure_and_branches():
    offset = 10.0

    def build(record, x):
        def inner(a, k=2.0, *, scale=1.0):
            if a > 1:
                return (a + offset) * scale
            return a * k
        return pfb.numpy_function(record(inner), [x], tf.float32)
    (func,) = converted_functions(build, tf.constant(3.0))
    user = _autograph.user_function(func)
    assert user.__name__ == "inner" and user.__code__.co_filename == __file__
    assert user(np.float32(3)) == 13.0 and user(np.float32(0.5)) == 1.0
    assert user(np.float32(3), scale=2.0) == 26.0
    assert pickle.loads(_autograph.dumps(user))(np.float32(3)) == 13.0


def test_functions_not_converted_pickle_as_before():
    def plain(a):
        return a
    assert not _autograph.converted(plain) and not _autograph.converted(np.negative)
    assert pickle.loads(_autograph.dumps(plain))(5) == 5


def test_ambiguous_functions_are_refused_with_the_fix():
    """Two lambdas without arguments on one line, one with a conditional (whose
    branches autograph turns into lambdas of its own): neither order nor line
    tells them apart."""
    c = 1.0

    def build(record):
        both = (lambda: np.float32(1) if c else np.float32(2)), (lambda: np.float32(3 * c))
        return [pfb.numpy_function(record(f), [], tf.float32) for f in both]
    funcs = converted_functions(build)
    line = build.__code__.co_firstlineno + 1
    with pytest.raises(_autograph.NotRecoverable,
                       match=rf"the function <lambda> \(line {line} of .*test_api_autograph.py\) "
                             r"was converted by autograph .*\(2 functions of its name and "
                             r"arguments are defined there\); define it outside the traced "
                             r"function"):
        _autograph.user_function(funcs[1])


def test_a_function_whose_original_autograph_dropped_is_refused_clearly():
    (func,) = converted_functions(lambda record, x: pfb.numpy_function(
        record(lambda a: np.negative(a)), [x], tf.float32), tf.constant(1.0))
    root, _ = _autograph._factory_of(func.__code__.co_filename)
    records = autograph_api._TRANSPILER._cache._cache
    with autograph_api._TRANSPILER._cache_lock:
        saved = records.pop(root)
    try:
        with pytest.raises(TypeError, match=r"cannot be sent to a worker process .*converted "
                                            r"by autograph .*no longer holds"):
            pickle_function(func)
        with pytest.raises(TypeError, match="portable=True: .* cannot be pickled .*autograph"):
            pfb._portable.pickled(func, func)
    finally:
        records[root] = saved
