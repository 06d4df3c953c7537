"""Function lifetimes in every kind of graph: the graphs of the older
``Defun`` functions (framework/function.py), which tf.data's legacy map
builds, keep their functions as long as the dataset or definition that
holds the op, as TensorFlow's do, and no longer.  TensorFlow's own
functions are the oracle of the values."""
import json

import pytest
import tensorflow as tf
from tensorflow.python.framework import function

import pyfunc_bridge as pfb
from conftest import ROOT, collect, script_env
from fresh_python import fresh_python

# name -> (TensorFlow's function, pfb's), both called as api(func, inp, Tout).
APIS = {
    "py_func": (tf.compat.v1.py_func, pfb.py_func),
    "numpy_function": (tf.numpy_function, pfb.numpy_function),
    "py_function": (tf.py_function, pfb.py_function),
}


def legacy_map(api, n=4):
    """Dataset.range(n) mapped by a legacy (Defun) function that calls `api`."""
    return tf.compat.v1.data.Dataset.range(n).map_with_legacy_function(
        lambda x: api(lambda v: v * 2, [x], tf.int64))


def values(ds):
    return [int(v) for v in ds.as_numpy_iterator()]


@pytest.mark.parametrize("name", sorted(APIS))
def test_legacy_map_runs_after_a_collection(name):
    theirs, ours = APIS[name]
    want = legacy_map(theirs)
    got = legacy_map(ours)
    collect()  # the graph the function was traced in is gone by now
    assert values(got) == values(want) == [0, 2, 4, 6]
    collect()
    assert values(got) == [0, 2, 4, 6]  # a second iterator over the same dataset


def nested_defun(api):
    """A Defun calling another Defun, each with an op of `api`."""
    @function.Defun(tf.int64)
    def outer(x):
        @function.Defun(tf.int64)
        def inner(y):
            return api(lambda v: v + 1, [y], tf.int64)
        return inner(x) * api(lambda v: v * 3, [x], tf.int64)
    return outer


def run_defun(mode, api):
    """nested_defun(api) on 0, 1, 2 in `mode`, collecting before it runs."""
    x = tf.constant([0, 1, 2], tf.int64)
    if mode == "map":
        ds = tf.data.Dataset.range(3).map(nested_defun(api))
    elif mode == "legacy map":
        ds = (lambda f: tf.compat.v1.data.Dataset.range(3).map_with_legacy_function(
            lambda v: f(v)))(nested_defun(api))
    elif mode == "tf.function":
        fn = (lambda f: tf.function(lambda v: tf.map_fn(f, v)))(nested_defun(api))
        collect()
        return fn(x).numpy().tolist()
    else:
        assert mode == "session"
        with tf.Graph().as_default():
            y = tf.map_fn(nested_defun(api), tf.constant([0, 1, 2], tf.int64))
            collect()
            with tf.compat.v1.Session() as sess:
                return sess.run(y).tolist()
    collect()
    return values(ds)


@pytest.mark.parametrize("mode", ["map", "legacy map", "tf.function", "session"])
def test_defun_graphs_keep_their_functions(mode):
    theirs, ours = APIS["py_func"]
    assert run_defun(mode, ours) == run_defun(mode, theirs) == [0, 6, 18]


def test_dropped_legacy_datasets_release_their_functions(registry):
    kept = legacy_map(pfb.numpy_function)
    collect()
    before = len(registry)
    for _ in range(1000):
        legacy_map(pfb.py_func)
    collect()
    assert len(registry) == before
    assert values(kept) == [0, 2, 4, 6]  # the one still held still runs
    del kept
    collect()
    assert len(registry) == before - 1


def test_dropped_defun_graphs_release_their_functions(registry):
    collect()
    before = len(registry)
    for _ in range(300):
        with tf.Graph().as_default():
            nested_defun(pfb.py_func)(tf.constant(1, tf.int64))
    for _ in range(300):
        tf.function(lambda x: nested_defun(pfb.numpy_function)(x)).get_concrete_function(
            tf.TensorSpec([], tf.int64))
    collect()
    assert len(registry) == before


def test_legacy_map_in_tf1_mode_matches_tf():
    # TF1 behaviour is for the whole process, hence a fresh one.
    proc = fresh_python("api/lifetimes_legacy_map_in_tf1_mode.py", timeout=300, cwd=ROOT,
                        env=script_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert out == {f"{side} {mode}": [0, 2, 4, 6]
                   for side in ("tf", "pfb") for mode in ("graph", "eager")}
