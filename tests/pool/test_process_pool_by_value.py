"""Process workers (executor=): which functions travel by value, checked by
the modules a worker has loaded after running them.

A pipeline module imports TensorFlow; a map function in it that uses NumPy
only must run in a worker that never imports TensorFlow (seconds of start-up
and hundreds of MiB per worker), so it travels by value.  The modules are
written to a temporary folder; each worker is asked for its ``sys.modules``
(process_functions.loaded, a function of a module without TensorFlow).
"""
import importlib
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import pickling as _pickling

MODULES = {
    # A pipeline module: imports TensorFlow, and maps that need only NumPy.
    "pfb_tf_pipeline.py": """
        import threading

        import numpy as np
        import tensorflow as tf

        SCALE = np.float32(3)
        _LOCK = threading.Lock()


        def scale(a):
            return a * SCALE


        def numpy_map(a):  # a helper of its module, and NumPy
            return scale(a) + 1


        def tf_map(a):  # TensorFlow itself
            return tf.math.multiply(tf.constant(a), 2).numpy()


        class BadRecord(ValueError):
            pass


        def refuse(a):
            raise BadRecord(f"bad record {a.tolist()}")


        def locked_double(a):  # a global that does not pickle
            with _LOCK:
                return a * 2
    """,
    # Imports TensorFlow only through the module its helper comes from.
    "pfb_tf_helpers.py": """
        import tensorflow as tf


        def halve(a):
            return a / 2
    """,
    "pfb_indirect.py": """
        from pfb_tf_helpers import halve


        def half_plus_one(a):
            return halve(a) + 1
    """,
    # A package whose __init__ imports TensorFlow: importing a submodule runs it.
    "pfb_tf_package/__init__.py": """
        import tensorflow as tf
    """,
    "pfb_tf_package/plain.py": """
        import numpy as np


        def negate(a):
            return np.negative(a)
    """,
    # No TensorFlow anywhere: by name, imported in the worker.
    "pfb_plain.py": """
        import numpy as np


        def triple(a):
            return a * 3
    """,
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """The modules above, importable in this process (and in workers started
    after this)."""
    folder = tmp_path_factory.mktemp("by_value_modules")
    for name, text in MODULES.items():
        path = folder / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(textwrap.dedent(text))
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith("pfb_")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def pool(modules):
    """One worker, so that the probe asks the worker that ran the function.
    Only the tests that leave TensorFlow unloaded use it."""
    with pfb.ProcessPool(1, name="by value pool") as shared:
        yield shared


def worker_loaded(pool, *names):
    """Which of the modules `names` the pool's worker has imported."""
    return pfb.numpy_function(pf.loaded, [tf.constant(list(names))], tf.bool,
                              executor=pool).numpy().tolist()


def run(func, pool, x=(1.0, 2.0, 3.0)):
    """func on x through the pool, checked against the in-process result."""
    x = tf.constant(x, tf.float32)
    expected = pfb.numpy_function(func, [x], tf.float32).numpy()
    got = pfb.numpy_function(func, [x], tf.float32, executor=pool).numpy()
    np.testing.assert_array_equal(got, expected)
    return got


@pytest.mark.parametrize("module, function, by_value", [
    ("pfb_tf_pipeline", "numpy_map", True),     # its module imports TensorFlow
    ("pfb_indirect", "half_plus_one", True),    # through the module of a helper
    ("pfb_tf_package.plain", "negate", True),   # its package's __init__ does
    ("pfb_plain", "triple", False),             # no TensorFlow: by name
])
def test_the_by_value_rule_checked_by_the_workers_loaded_modules(modules, pool, module,
                                                                 function, by_value):
    func = getattr(modules(module), function)
    run(func, pool)
    # A function sent by value leaves its module unimported in the worker;
    # one sent by name imports it there.  Neither brings TensorFlow in.
    assert worker_loaded(pool, module, "tensorflow") == [not by_value, False]
    if module == "pfb_indirect":
        assert worker_loaded(pool, "pfb_tf_helpers") == [False]


def test_a_numpy_map_from_a_tensorflow_module_runs_in_a_worker_without_tensorflow(
        modules, pool):
    pipeline = modules("pfb_tf_pipeline")
    assert run(pipeline.numpy_map, pool).tolist() == [4.0, 7.0, 10.0]
    dataset = tf.data.Dataset.range(20).map(
        lambda i: pfb.numpy_function(pipeline.numpy_map, [tf.cast(i, tf.float32)],
                                     tf.float32, executor=pool),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    assert list(dataset.as_numpy_iterator()) == [3.0 * i + 1 for i in range(20)]
    assert worker_loaded(pool, "tensorflow", "pfb_tf_pipeline") == [False, False]


def test_an_exception_class_of_a_tensorflow_module_comes_back_without_importing_it(
        modules, pool):
    # Sending the exception back by its name would import its module (and
    # TensorFlow) in the worker: it travels by value, as the function did.
    pipeline = modules("pfb_tf_pipeline")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad record \[1\.0\]"):
        pfb.numpy_function(pipeline.refuse, [tf.constant([1.0])], tf.float32,
                           executor=pool)
    assert worker_loaded(pool, "tensorflow", "pfb_tf_pipeline") == [False, False]


def test_a_function_that_uses_tensorflow_imports_it_in_the_worker(modules):
    pipeline = modules("pfb_tf_pipeline")
    with pfb.ProcessPool(1, name="tf user pool") as one:
        run(pipeline.numpy_map, one)
        assert worker_loaded(one, "tensorflow") == [False]
        assert run(pipeline.tf_map, one).tolist() == [2.0, 4.0, 6.0]
        assert worker_loaded(one, "tensorflow", "pfb_tf_pipeline") == [True, False]


def test_a_function_whose_globals_do_not_pickle_travels_by_name(modules):
    # By value fails on the lock: sent by name as before, the worker imports
    # its module (and so TensorFlow) and the call runs.
    pipeline = modules("pfb_tf_pipeline")
    with pfb.ProcessPool(1, name="by name pool") as one:
        assert run(pipeline.locked_double, one).tolist() == [2.0, 4.0, 6.0]
        assert worker_loaded(one, "pfb_tf_pipeline") == [True]


# ------------------------------------------- the rule, without a worker --

@pytest.mark.parametrize("module, imports", [
    ("pfb_tf_pipeline", True),
    ("pfb_indirect", True),
    ("pfb_tf_package.plain", True),
    ("pfb_plain", False),
    ("process_functions", False),
    ("numpy", False),
    ("tensorflow", True),
])
def test_imports_tensorflow_follows_the_modules_globals(modules, module, imports):
    assert _pickling.imports_tensorflow(modules(module)) is imports


def test_an_instance_of_a_tensorflow_module_class_counts(modules, tmp_path):
    """A global holding an instance brings its class's module along."""
    path = tmp_path / "pfb_holds_an_instance.py"
    path.write_text("from pfb_tf_pipeline import BadRecord\n"
                    "ERROR = BadRecord('x')\n"
                    "del BadRecord\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert _pickling.imports_tensorflow(modules("pfb_holds_an_instance")) is True
    finally:
        sys.path.remove(str(tmp_path))


def test_the_pickle_leaves_no_module_registered_by_value(modules):
    import cloudpickle
    pipeline = modules("pfb_tf_pipeline")
    before = cloudpickle.list_registry_pickle_by_value()
    _pickling.dumps(pipeline.numpy_map, 5)
    assert cloudpickle.list_registry_pickle_by_value() == before
    _pickling.dumps(pipeline.locked_double, 5)  # by value fails: by name
    assert cloudpickle.list_registry_pickle_by_value() == before


def _adder(k):
    def add(a):
        return a + k
    return add


@pytest.mark.parametrize("dumps", ["pool", "portable"])
def test_functions_sent_by_value_keep_their_file_name_for_tracebacks(dumps):
    """A function pickled by value (a lambda, a closure, a nested function's
    code) names its file where it is unpickled, so that a worker's traceback
    points at the user's line (cloudpickle 3.1.3 names it "<dynamic-code>")."""
    import pickle

    from pyfunc_bridge import _autograph
    pickled = (_pickling.dumps if dumps == "pool" else _autograph.dumps)
    lam = lambda a: a * 2  # noqa: E731
    for func in (lam, _adder(3), _adder):
        loaded = pickle.loads(pickled(func, 5))
        assert loaded.__code__.co_filename == __file__, loaded.__code__.co_filename
        assert loaded.__code__.co_firstlineno == func.__code__.co_firstlineno
    inner = pickle.loads(pickled(_adder, 5))(1)
    assert inner.__code__.co_filename == __file__ and inner(1) == 2


BUILTINS = {"numpy_function": tf.numpy_function, "py_func": tf.compat.v1.py_func,
            "py_function": tf.py_function}


@pytest.mark.parametrize("builtin", BUILTINS.values(), ids=BUILTINS.keys())
def test_a_function_a_tensorflow_builtin_saw_first_still_travels(pool, builtin):
    """TF's builtins tie their registration to the function they are given by
    an attribute that holds autograph's wrapper (which pickles only with
    TensorFlow): the function still goes to a worker, which does not import
    TensorFlow for it, and still embeds in a graph with portable=True."""
    def plus_one(x):
        return np.int64(int(x) + 1)

    def total(mapper):
        ds = tf.data.Dataset.range(4).map(mapper, num_parallel_calls=tf.data.AUTOTUNE)
        return int(tf.function(
            lambda: ds.reduce(tf.constant(0, tf.int64), lambda a, v: a + v))())

    assert total(lambda x: builtin(plus_one, [x], tf.int64)) == 10
    assert total(lambda x: pfb.numpy_function(plus_one, [x], tf.int64, executor=pool)) == 10
    assert worker_loaded(pool, "tensorflow") == [False]
    portable = tf.function(lambda x: pfb.numpy_function(plus_one, [x], tf.int64, portable=True))
    assert int(portable(tf.constant(1, tf.int64))) == 2
