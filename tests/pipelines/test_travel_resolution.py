"""Functions whose source graph is gone (pyfunc_bridge/_portable.py,
_resolve.py): imported graph defs, pruned and saved functions resolve their
keys from the call's description, once per key under concurrency, with
errors that name the key and the fix."""
import gc
import threading
import uuid

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import travel_functions
from pyfunc_bridge import _portable, _resolve
from travel_helpers import X


def _key_of(graph_def):
    return next(n.attr["key"].s.decode() for n in graph_def.node
                if n.op.startswith("PyfuncBridge>"))


# Dropped source graphs, in this process.

@pytest.fixture
def trusting():
    previous = pfb.trust_pickled(True)
    yield
    pfb.trust_pickled(previous)


def _graph_def(fn):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        tf.identity(fn(x), name="y")
    return graph.as_graph_def()


def _run_imported(graph_def):
    with tf.Graph().as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as sess:
            return sess.run("y:0", {"x:0": X})


@pytest.mark.parametrize("portable", [False, True])
def test_import_graph_def_after_the_source_graph_is_gone(registry, trusting, portable):
    if portable:
        scale = 3.0
        graph_def = _graph_def(lambda x: pfb.numpy_function(
            lambda a: a * scale, [x], tf.float32, portable=True))
    else:
        graph_def = _graph_def(lambda x: pfb.numpy_function(
            travel_functions.times2, [x], tf.float32))
    gc.collect()
    assert _key_of(graph_def) not in registry  # only resolution can find it
    np.testing.assert_array_equal(_run_imported(graph_def), X * (3 if portable else 2))


def test_import_graph_def_without_a_portable_function_fails():
    graph_def = _graph_def(lambda x: pfb.numpy_function(lambda a: a, [x], tf.float32))
    gc.collect()
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _run_imported(graph_def)
    assert _key_of(graph_def) in info.value.message
    assert "no portable reference" in info.value.message
    assert "portable=True" in info.value.message


def test_pruned_wrap_function_after_the_wrapped_one_is_gone(registry):
    wrapped = tf.compat.v1.wrap_function(
        lambda x: pfb.numpy_function(travel_functions.times2, [x], tf.float32),
        [tf.TensorSpec([None], tf.float32)])
    pruned = wrapped.prune(wrapped.inputs[0], wrapped.outputs[0])
    key = _key_of(wrapped.graph.as_graph_def())
    del wrapped
    gc.collect()
    assert key not in registry
    np.testing.assert_array_equal(pruned(tf.constant(X)).numpy(), X * 2)


def test_saved_model_after_the_module_is_deleted(tmp_path):
    module = tf.Module()
    module.f = tf.function(
        lambda x: pfb.numpy_function(travel_functions.times2, [x], tf.float32),
        input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "model"))
    del module
    gc.collect()
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_array_equal(loaded.f(tf.constant(X)).numpy(), X * 2)


def test_py_function_with_ragged_output_travels_pickled(trusting):
    spec = tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)

    def split(a):
        return tf.RaggedTensor.from_row_lengths(a, [1, 2])
    graph_def = _graph_def(lambda x: pfb.py_function(split, [x], spec, portable=True).values)
    gc.collect()
    np.testing.assert_array_equal(_run_imported(graph_def), X)


# --------------------------------------------------------------------------
# The conversion layer: a miss reads the description from the call (the ABI).

def _float_output(outs):
    import ctypes
    t = outs[0].contents.dl_tensor
    values = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)),
                                   (t.shape[0],)).copy()
    outs[0].contents.deleter(outs[0])
    return values


@pytest.mark.parametrize("how", ["reference", "pickled"])
def test_bridge_call_resolves_a_missing_key_from_the_call(api, registry, trusting, how):
    import cloudpickle
    import dlpack_ctypes as dl
    key = f"tests:abi@{uuid.uuid4().hex}"
    description = ({"reference": b"travel_functions:times2"} if how == "reference" else
                   {"pickled": cloudpickle.dumps(lambda a: a * 2)})
    if how == "pickled":
        assert b"\0" in description["pickled"]  # crosses the ABI by length
    code, message, outs = dl.call(api, key, [dl.Producer().tensor(X)], [dl.spec()],
                                  **description)
    assert (code, message) == (0, None)
    np.testing.assert_array_equal(_float_output(outs), X * 2)
    assert registry[key]() is not None  # the next call takes the registered path


def test_bridge_call_without_a_description_names_the_key(api):
    import dlpack_ctypes as dl
    code, message, _ = dl.call(api, "tests:nothing@1", [dl.Producer().tensor(X)],
                               [dl.spec()])
    assert code == 3  # InvalidArgument
    assert "'tests:nothing@1'" in message and "no portable reference" in message


# --------------------------------------------------------------------------
# Resolution: once per key, under concurrency.

def test_concurrent_misses_resolve_exactly_once(registry, trusting):
    import cloudpickle
    payload = cloudpickle.dumps(travel_functions.SlowlyUnpickled())
    key = f"tests:concurrent@{uuid.uuid4().hex}"
    made, resolutions = travel_functions.made, _resolve.resolutions
    barrier = threading.Barrier(16)
    entries = []

    def miss():
        barrier.wait()
        entries.append(_resolve.resolve(key, "", payload, "", False, 1))
    threads = [threading.Thread(target=miss) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(entries) == 16
    assert travel_functions.made - made == 1
    assert _resolve.resolutions - resolutions == 1
    assert all(e is entries[0] for e in entries)
    assert entries[0].func is travel_functions.times2
    assert registry[key]() is entries[0]  # later calls take the registered path
    assert key not in _resolve._key_locks  # no lock kept per resolved key


def test_parallel_pipeline_misses_resolve_once(trusting):
    import cloudpickle
    payload = cloudpickle.dumps(travel_functions.SlowlyUnpickled())
    key = f"tests:pipeline@{uuid.uuid4().hex}"
    made = travel_functions.made
    op = pfb._library.ops().pyfunc_bridge_numpy_function
    ds = tf.data.Dataset.range(32).map(
        lambda i: op(input=[i], key=key, pickled=payload, Tout=[tf.int64])[0],
        num_parallel_calls=8)
    assert sorted(int(v) for v in ds) == [2 * i for i in range(32)]
    assert travel_functions.made - made == 1


def test_failed_resolution_is_not_cached(registry):
    # A process may import the module after a first failure.
    key = f"tests:retry@{uuid.uuid4().hex}"
    reference = "travel_functions:late"
    with pytest.raises(ValueError, match="did not declare"):
        _resolve.resolve(key, reference, b"", "", False, 1)

    def late(a):
        return a
    late.__module__, late.__qualname__ = "travel_functions", "late"
    pfb.portable(late)
    try:
        assert _resolve.resolve(key, reference, b"", "", False, 1).func is late
    finally:
        del _portable._declared[reference]


def test_resolution_records_the_framework(trusting):
    pytest.importorskip("torch")
    entry = _resolve.resolve(f"tests:fw@{uuid.uuid4().hex}", "travel_functions:times2",
                              b"", "torch", False, 1)
    assert entry.framework.name == "torch"


def test_untrusted_pickle_error_names_the_key():
    previous = pfb.trust_pickled(False)
    try:
        with pytest.raises(ValueError) as info:
            _resolve.resolve("tests:untrusted@1", "", b"payload", "", False, 1)
    finally:
        pfb.trust_pickled(previous)
    assert "'tests:untrusted@1'" in str(info.value)
    assert "arbitrary code" in str(info.value)


def test_undeclared_reference_and_untrusted_pickle_give_both_fixes():
    previous = pfb.trust_pickled(False)
    try:
        with pytest.raises(ValueError) as info:
            _resolve.resolve(f"tests:both@{uuid.uuid4().hex}",
                              "travel_functions:undeclared_writer", b"payload", "", False, 1)
    finally:
        pfb.trust_pickled(previous)
    assert "@pfb.portable" in str(info.value)
    assert "arbitrary code" in str(info.value)


def test_unknown_framework_is_an_error():
    with pytest.raises(ValueError, match="framework must be one of"):
        _resolve.resolve(f"tests:framework@{uuid.uuid4().hex}", "travel_functions:times2",
                          b"", "fortran", False, 1)


def test_broken_pickle_says_what_failed(trusting):
    with pytest.raises(ValueError, match="could not be unpickled"):
        _resolve.resolve(f"tests:broken@{uuid.uuid4().hex}", "", b"not a pickle", "",
                          False, 1)
