"""The public op layer: pfb.numpy_function / pfb.py_func against TF's builtins.

The contract every API shares (modes, Tout, counts, shapes, exceptions,
argument errors, lifetimes) is in test_api_contract.py."""
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import collect

STATEFUL_OP = "PyfuncBridge>NumpyFunction"
STATELESS_OP = "PyfuncBridge>NumpyFunctionStateless"


# --------------------------------------------------------------------------
# Results (the modes every API shares are in test_api_contract.py).

def test_session_runs_py_func_per_feed():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None])
        y = pfb.py_func(np.cumsum, [x], tf.float64)
        with tf.compat.v1.Session() as sess:
            first = sess.run(y, {x: [1.0, 2.0, 3.0]})
            second = sess.run(y, {x: [5.0, -5.0]})
    np.testing.assert_array_equal(first, [1.0, 3.0, 6.0])
    np.testing.assert_array_equal(second, [5.0, 0.0])


# --------------------------------------------------------------------------
# Tout forms.

X = tf.constant([1.0, 2.0, 3.0, 4.0])


def test_single_dtype_returns_a_tensor():
    y = pfb.numpy_function(lambda a: a + 1, [X], tf.float32)
    assert isinstance(y, tf.Tensor)
    np.testing.assert_array_equal(y.numpy(), [2, 3, 4, 5])


def test_numpy_dtype_tout():
    y = pfb.numpy_function(lambda a: a * 2, [X], np.float32)
    assert isinstance(y, tf.Tensor)
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), [2, 4, 6, 8])


@pfb.numpy_function(Tout=tf.TensorSpec([None, 2], tf.float32))
def pairs(a):
    return a.reshape(-1, 2)


def test_decorator_declares_static_shape():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        y = pairs(x)
        seen.append(y.shape)
        return y

    out = f(tf.range(6, dtype=tf.float32))
    assert len(seen) == 1
    assert seen[0].as_list() == [None, 2]
    np.testing.assert_array_equal(out.numpy(), [[0, 1], [2, 3], [4, 5]])
    # Eagerly too.
    assert pairs(tf.range(4, dtype=tf.float32)).shape == (2, 2)


def test_without_tensorspec_shape_is_unknown():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        y = pfb.numpy_function(lambda a: a.reshape(-1, 2), [x], tf.float32)
        seen.append(y.shape)
        return y

    f(tf.range(4, dtype=tf.float32))
    assert seen[0].rank is None


def test_list_mixing_tensorspec_and_dtype():
    seen = []

    def func(a):
        return a.astype(np.int32), np.array([str(v).encode() for v in a], dtype=object)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def f(x):
        ys = pfb.numpy_function(func, [x], [tf.TensorSpec([None], tf.int32), tf.string])
        seen.append([y.shape for y in ys])
        return ys

    ints, strings = f(tf.constant([1.0, 2.0]))
    assert seen[0][0].as_list() == [None]
    assert seen[0][1].rank is None
    np.testing.assert_array_equal(ints.numpy(), [1, 2])
    assert ints.dtype == tf.int32
    assert list(strings.numpy()) == [b"1.0", b"2.0"]


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, a):
        self.calls.append(np.array(a))  # returns None


def test_no_outputs_eager_runs_side_effect():
    rec = _Recorder()
    result = pfb.numpy_function(rec, [X], [])
    assert not result  # nothing to return
    assert len(rec.calls) == 1
    np.testing.assert_array_equal(rec.calls[0], [1, 2, 3, 4])


def test_no_outputs_tf_function_runs_side_effect():
    rec = _Recorder()

    @tf.function
    def f(x):
        pfb.numpy_function(rec, [x], [])
        return x + 1

    f(tf.constant([7.0]))
    f(tf.constant([8.0]))
    assert [c.tolist() for c in rec.calls] == [[7.0], [8.0]]


def test_no_outputs_session_runs_side_effect():
    rec = _Recorder()
    with tf.Graph().as_default():
        op = pfb.py_func(rec, [tf.constant([5, 6])], [])
        assert isinstance(op, tf.Operation)
        assert op.type == STATEFUL_OP
        with tf.compat.v1.Session() as sess:
            sess.run(op)
            sess.run(op)
    assert [c.tolist() for c in rec.calls] == [[5, 6], [5, 6]]


# --------------------------------------------------------------------------
# Decorator form.

def test_decorator_keyword_args():
    @pfb.numpy_function(Tout=tf.int64, stateful=False)
    def square(a):
        return a * a

    assert square.__name__ == "square"
    np.testing.assert_array_equal(square(tf.constant([2, 3], tf.int64)).numpy(), [4, 9])


def test_decorator_positional_args_and_several_inputs():
    @pfb.numpy_function(None, None, [tf.float64, tf.float64])
    def sum_and_diff(a, b):
        return a + b, a - b

    s, d = sum_and_diff(tf.constant([1.0, 2.0], tf.float64), tf.constant([0.5, 4.0], tf.float64))
    np.testing.assert_array_equal(s.numpy(), [1.5, 6.0])
    np.testing.assert_array_equal(d.numpy(), [0.5, -2.0])


def test_decorator_inside_tf_function():
    @pfb.numpy_function(Tout=tf.float32, name="decorated_op")
    def plus_one(a):
        return a + 1

    names = []

    @tf.function
    def f(x):
        y = plus_one(x)
        names.append(y.op.name)
        return y

    np.testing.assert_array_equal(f(tf.constant([1.0])).numpy(), [2.0])
    assert "decorated_op" in names[0]


def test_bare_decorator_without_tout_is_type_error():
    with pytest.raises(TypeError, match="Tout"):
        @pfb.numpy_function
        def f(a):
            return a


# --------------------------------------------------------------------------
# Errors at construction.

@pytest.mark.parametrize("api", [pfb.numpy_function, pfb.py_func])
def test_tout_none_is_type_error(api):
    with pytest.raises(TypeError, match="Missing required argument: 'Tout'"):
        api(lambda a: a, [X], None)


@pytest.mark.parametrize("dtype", [tf.resource, tf.qint8, tf.variant])
@pytest.mark.parametrize("as_list", [False, True])
def test_unsupported_tout_dtype_is_type_error(dtype, as_list):
    Tout = [tf.float32, dtype] if as_list else dtype
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a: a, [X], Tout)
    msg = str(info.value)
    assert dtype.name in msg
    assert "does not support" in msg
    assert ("Tout[1]" in msg) if as_list else msg.startswith("Tout")


def test_unsupported_tensorspec_dtype_is_type_error():
    with pytest.raises(TypeError, match="qint8"):
        pfb.numpy_function(lambda a: a, [X], tf.TensorSpec([None], tf.qint8))


def test_tout_not_a_dtype_is_type_error():
    with pytest.raises(TypeError, match="Tout"):
        pfb.numpy_function(lambda a: a, [X], "not-a-dtype")


@pytest.mark.parametrize("spec", [
    tf.RaggedTensorSpec([None, None], tf.float32),
    tf.SparseTensorSpec([None, 3], tf.float32),
], ids=["ragged", "sparse"])
def test_composite_typespec_is_type_error(spec):
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a: a, [X], spec)
    assert type(spec).__name__ in str(info.value)
    assert "composite" in str(info.value)


@pytest.mark.parametrize("copy", ["yes", 2, 1, 0, "none", "True"])
def test_bad_copy_is_value_error(copy):
    with pytest.raises(ValueError, match="copy must be None, True or False") as info:
        pfb.numpy_function(lambda a: a, [X], tf.float32, copy=copy)
    assert repr(copy) in str(info.value)


def test_tuple_inp_is_accepted():
    y = pfb.numpy_function(lambda a, b: a + b, (X, X), tf.float32)
    np.testing.assert_array_equal(y.numpy(), [2, 4, 6, 8])


@pytest.mark.parametrize("composite", [
    lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]),
    lambda: tf.sparse.from_dense(tf.constant([[0.0, 1.0]])),
], ids=["RaggedTensor", "SparseTensor"])
def test_composite_input_is_type_error(composite):
    value = composite()
    with pytest.raises(TypeError) as info:
        pfb.numpy_function(lambda a, b: a, [X, value], tf.float32)
    assert "inp[1]" in str(info.value)
    assert type(value).__name__ in str(info.value)


def test_unsupported_input_dtype_is_type_error():
    with pytest.raises(TypeError, match="inp\\[0\\].*qint8"):
        pfb.numpy_function(lambda a: a, [tf.constant([1], tf.qint8)], tf.float32)


# --------------------------------------------------------------------------
# Errors at run time (what the function returned).

def _run_error(func, Tout, inputs=None, mode="eager"):
    """Runs the op and returns the OpError it raised."""
    inputs = [X] if inputs is None else inputs
    if mode == "eager":
        with pytest.raises(tf.errors.OpError) as info:
            pfb.numpy_function(func, inputs, Tout)
    else:
        @tf.function
        def f(*xs):
            out = pfb.numpy_function(func, list(xs), Tout)
            return None if isinstance(out, tf.Operation) else out

        with pytest.raises(tf.errors.OpError) as info:
            f(*inputs)
    return info.value


MODES = ["eager", "tf_function"]


@pytest.mark.parametrize("mode", MODES)
def test_wrong_dtype_returned(mode):
    err = _run_error(lambda a: a.astype(np.float64), tf.float32, mode=mode)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 0" in err.message
    assert "float32" in err.message and "float64" in err.message
    assert "astype" in err.message


def test_wrong_dtype_names_the_output_index():
    err = _run_error(lambda a: (a, a.astype(np.int16)), [tf.float32, tf.float32])
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "output 1" in err.message
    assert "int16" in err.message and "astype(np.float32)" in err.message


def test_declared_static_dimension_mismatch():
    err = _run_error(lambda a: a.reshape(2, 2), tf.TensorSpec([2, 3], tf.float32))
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "(2, 3)" in err.message and "(2, 2)" in err.message


def test_declared_shape_matches():
    y = pfb.numpy_function(lambda a: a.reshape(2, 2), [X], tf.TensorSpec([2, None], tf.float32))
    assert y.shape == (2, 2)


@pytest.mark.parametrize("value", [7, 1.5, np.arange(3, dtype=np.float32)],
                         ids=["int", "float", "ndarray"])
def test_string_declared_number_returned(value):
    err = _run_error(lambda a: value, tf.string)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "string" in err.message


def test_python_float_for_int32_is_lossy_error():
    err = _run_error(lambda a: 2.5, tf.int32)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int32" in err.message and "without loss" in err.message


def test_python_list_of_floats_for_int_is_error():
    err = _run_error(lambda a: ([1.5, 2.0],), [tf.int64])
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "int64" in err.message and "without loss" in err.message


def test_python_list_for_single_output_counts_as_outputs():
    # As in TF: a list or tuple holds one value per output.
    err = _run_error(lambda a: [1.0, 2.0], tf.float64)
    assert isinstance(err, tf.errors.InvalidArgumentError)
    assert "returned 2 value" in err.message and "np.asarray" in err.message


@pytest.mark.parametrize("value,Tout,want", [
    (3, tf.float32, np.float32(3.0)),
    (-3, tf.int8, np.int8(-3)),
    (2.5, tf.float64, np.float64(2.5)),
    (True, tf.bool, np.bool_(True)),
    (1 + 2j, tf.complex64, np.complex64(1 + 2j)),
    (np.float32(1.25), tf.float32, np.float32(1.25)),
    ("h\u00e9", tf.string, "h\u00e9".encode()),
    (b"raw", tf.string, b"raw"),
], ids=["int->float32", "int->int8", "float->float64", "bool", "complex", "np.float32",
        "str", "bytes"])
def test_python_values_convert(value, Tout, want):
    y = pfb.numpy_function(lambda a: value, [X], Tout)
    assert y.dtype == Tout
    assert y.shape == ()
    assert y.numpy() == want


def test_nested_python_list_converts():
    (y,) = pfb.numpy_function(lambda a: ([[1, 2], [3, 4]],), [X], [tf.float64])
    assert y.dtype == tf.float64
    np.testing.assert_array_equal(y.numpy(), [[1.0, 2.0], [3.0, 4.0]])


# --------------------------------------------------------------------------
# Python exceptions -> TF error classes, with the traceback.

# --------------------------------------------------------------------------
# name=

@pytest.mark.parametrize("stateful", [True, False])
def test_name_sets_op_name_in_graph(stateful):
    with tf.Graph().as_default():
        y = pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32,
                               stateful=stateful, name="my_bridge")
        z = pfb.py_func(np.negative, [tf.constant(1.0)], [tf.float32], name="my_bridge")
        assert y.op.name.startswith("my_bridge")
        assert z[0].op.name.startswith("my_bridge")
        assert y.op.name != z[0].op.name  # uniquified
        assert y.op.type == (STATEFUL_OP if stateful else STATELESS_OP)


def test_name_inside_tf_function():
    names = []

    @tf.function
    def f(x):
        with tf.name_scope("outer"):
            y = pfb.numpy_function(np.negative, [x], tf.float32, name="inner_bridge")
        names.append(y.op.name)
        return y

    assert f(tf.constant(2.0)).numpy() == -2.0
    assert names[0].startswith("outer/inner_bridge")


def test_name_accepted_eagerly():
    y = pfb.numpy_function(np.negative, [X], tf.float32, name="eager_name")
    np.testing.assert_array_equal(y.numpy(), [-1, -2, -3, -4])


# --------------------------------------------------------------------------
# The function registry.

KEY_RE = re.compile(r"^(?P<ref>.+)@(?P<uid>[0-9a-f]{32})$")


def module_level_function(a):
    return a


class _Callable:
    def __call__(self, a):
        return a

    def method(self, a):
        return a


@pytest.mark.parametrize("func,ref", [
    (module_level_function, f"{__name__}:module_level_function"),
    (_Callable().method, f"{__name__}:_Callable.method"),
    (_Callable(), f"{__name__}:_Callable"),
    (lambda a: a, f"{__name__}:<lambda>"),
], ids=["function", "method", "callable_object", "lambda"])
def test_registry_key_format(func, ref, registry):
    entry = pfb._registry.register(func)
    m = KEY_RE.match(entry.key)
    assert m, entry.key
    assert m.group("ref") == ref
    assert registry[entry.key]() is entry
    assert pfb._registry.lookup(entry.key) is entry
    assert entry.func is func


def test_registry_keys_unique_and_weak(registry):
    entries = [pfb._registry.register(module_level_function) for _ in range(1000)]
    keys = {e.key for e in entries}
    assert len(keys) == 1000
    assert all(k in registry for k in keys)
    del entries
    collect()
    assert not keys & registry.keys()


def test_eager_calls_do_not_grow_registry(registry):
    collect()
    before = len(registry)
    for i in range(50):
        pfb.numpy_function(lambda a: a + i, [X], tf.float32)
    assert len(registry) == before


def test_tf_function_keeps_function_registered(registry):
    def kept_alive(a):
        return a * 10

    tfn = tf.function(lambda x: pfb.numpy_function(kept_alive, [x], tf.float32))
    np.testing.assert_array_equal(tfn(X).numpy(), [10, 20, 30, 40])
    keys = [k for k, ref in list(registry.items())
            if ref() is not None and ref().func is kept_alive]
    assert len(keys) == 1
    collect()
    assert keys[0] in registry
    np.testing.assert_array_equal(tfn(tf.constant([0.5, 1.5, 2.5, 3.5])).numpy(),
                                  [5, 15, 25, 35])
    collect()
    np.testing.assert_array_equal(tfn(X).numpy(), [10, 20, 30, 40])
    del tfn
    collect()
    assert keys[0] not in registry


def test_missing_key_names_the_key():
    op = pfb._library.ops().pyfunc_bridge_numpy_function
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        op(input=[X], key="tests:missing@x", Tout=[tf.float32])
    assert "tests:missing@x" in info.value.message
    assert "no Python function is registered" in info.value.message


# --------------------------------------------------------------------------
# Import cost and version check (in a fresh interpreter).

_SUBPROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    # TensorFlow itself imports jax when it is installed (and cloudpickle):
    # only new imports count.
    already = {m for m in ("torch", "jax", "jaxlib", "cloudpickle") if m in sys.modules}
    POOL = ("pyfunc_bridge.pool.process_pool", "pyfunc_bridge.worker.start_worker",
            "pyfunc_bridge.pool.statistics", "pyfunc_bridge._pool_worker",
            "pyfunc_bridge.pool.pickling", "cloudpickle")

    def state():
        with open("/proc/self/maps") as f:
            kernels = sorted({line.split()[-1] for line in f if "/_kernels." in line})
        return {
            "conversion": "pyfunc_bridge._conversion" in sys.modules,
            "kernels": kernels,
            "heavy": sorted(m for m in ("torch", "jax", "jaxlib")
                            if m in sys.modules and m not in already),
            "pool": sorted(m for m in POOL if m in sys.modules and m not in already),
        }

    real = tf.__version__
    tf.__version__ = "2.20.0"
    try:
        import pyfunc_bridge
        mismatch = None
    except ImportError as e:
        mismatch = str(e)
    tf.__version__ = real
    for name in [m for m in sys.modules if m.startswith("pyfunc_bridge")]:
        del sys.modules[name]

    import pyfunc_bridge as pfb
    after_import = state()
    not_in_dir = [name for name in pfb.__all__ if name not in dir(pfb)]
    after_dir = state()
    y = pfb.numpy_function(lambda a: a + 1, [tf.constant(1.0)], tf.float32)
    after_use = state()
    stats = pfb.stats()  # (no pool used: the pools' statistics are not loaded for it)
    after_stats = state()
    import numpy as np
    with pfb.ProcessPool(1) as pool:
        z = pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32, executor=pool)
    after_pool = state()
    print(json.dumps({"mismatch": mismatch, "after_import": after_import,
                      "not_in_dir": not_in_dir, "after_dir": after_dir,
                      "after_use": after_use, "value": float(y), "after_stats": after_stats,
                      "pools": list(stats.pools), "after_pool": after_pool,
                      "pool_value": float(z)}))
""")


@pytest.fixture(scope="module")
def fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_is_cheap(fresh_interpreter):
    # The op library loads at import (graphs naming the ops must load), the
    # conversion layer and the frameworks on first use.
    state = fresh_interpreter["after_import"]
    assert state["conversion"] is False
    assert len(state["kernels"]) == 1
    assert state["heavy"] == []
    assert state["pool"] == []  # the process pool loads on first use (pfb.ProcessPool)


def test_dir_lists_the_lazy_names_without_loading_them(fresh_interpreter):
    # (ProcessPool and the conversion API are module attributes made on first access.)
    assert fresh_interpreter["not_in_dir"] == []
    assert fresh_interpreter["after_dir"] == fresh_interpreter["after_import"]


def test_first_use_loads_the_libraries(fresh_interpreter):
    # The check above would be vacuous if the probes could not see the libraries.
    state = fresh_interpreter["after_use"]
    assert fresh_interpreter["value"] == 2.0
    assert state["conversion"] is True
    assert len(state["kernels"]) == 1
    assert state["heavy"] == []
    # In-process calls and the statistics need no pool module.
    assert state["pool"] == [] and fresh_interpreter["after_stats"]["pool"] == []
    assert fresh_interpreter["pools"] == []


def test_a_pool_loads_its_modules_on_first_use(fresh_interpreter):
    state = fresh_interpreter["after_pool"]
    assert fresh_interpreter["pool_value"] == -1.0
    # (cloudpickle counts where TensorFlow did not import it already.)
    assert {"pyfunc_bridge.pool.process_pool", "pyfunc_bridge.worker.start_worker",
            "pyfunc_bridge.pool.statistics", "pyfunc_bridge._pool_worker",
            "pyfunc_bridge.pool.pickling"} <= set(state["pool"])


def test_import_with_mismatched_tf_fails(fresh_interpreter):
    from pyfunc_bridge._build_config import TF_VERSION
    msg = fresh_interpreter["mismatch"]
    assert msg is not None
    assert "2.20.0" in msg and TF_VERSION in msg


def test_check_tensorflow_version(monkeypatch):
    from pyfunc_bridge._build_config import TF_VERSION
    pfb._library.check_tensorflow_version()  # the installed one passes
    monkeypatch.setattr(tf, "__version__", "2.20.0")
    with pytest.raises(ImportError) as info:
        pfb._library.check_tensorflow_version()
    msg = str(info.value)
    assert "2.20.0" in msg and TF_VERSION in msg
    assert "built for TensorFlow" in msg


@pytest.mark.parametrize("version", ["3.21.0", "2.2.0", "2.210.0"])
def test_check_tensorflow_version_compares_major_minor(monkeypatch, version):
    from pyfunc_bridge._build_config import TF_VERSION
    major, minor = TF_VERSION.split(".")[:2]
    monkeypatch.setattr(tf, "__version__", f"{major}.{minor}.99")
    pfb._library.check_tensorflow_version()  # a patch release is compatible
    monkeypatch.setattr(tf, "__version__", version)
    with pytest.raises(ImportError, match=re.escape(version)):
        pfb._library.check_tensorflow_version()
