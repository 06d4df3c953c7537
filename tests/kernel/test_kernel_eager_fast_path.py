"""py_function's EagerTensors made straight from the kernel's TF tensors and
read straight back (PfbEagerApi, src/kernel/eager_tensors.cc): the path taken
on the pinned TensorFlow, zero-copy by address both ways, lifetimes, and the
DLPack fallback when TF's exports are missing (simulated in a subprocess with
PFB_PRETEND_MISSING_SYMBOLS), which must give the same results and errors."""
import json
import os
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python import pywrap_tfe

import pyfunc_bridge as pfb
from pyfunc_bridge import _library
from conftest import address, collect
from fresh_python import fresh_python

# The TF exports the direct path needs (eager_tensors.cc), as the op layer names them.
EXPORTS = ("TFE_NewTensorHandle", "TFE_DeleteTensorHandle", "EagerTensorFromHandle",
           "EagerTensor_CheckExact", "EagerTensor_Handle", "TensorHandle::Tensor")
PRETEND = "PFB_PRETEND_MISSING_SYMBOLS"
pinned = pytest.mark.skipif(bool(os.environ.get(PRETEND)),
                            reason=f"{PRETEND} is set: the DLPack path is taken on purpose")


@pytest.fixture
def dlpack_calls(monkeypatch):
    """Counts the conversions through TF's DLPack functions (the fallback's
    way to make and read EagerTensors), which the conversion layer looks up
    on pywrap_tfe at every call."""
    calls = {"TFE_FromDlpackCapsule": 0, "TFE_ToDlpackCapsule": 0}
    for name in calls:
        real = getattr(pywrap_tfe, name)

        def counting(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)
        monkeypatch.setattr(pywrap_tfe, name, counting)
    return calls


def in_graph(func, Tout=tf.float32):
    @tf.function
    def f(*t):
        return pfb.py_function(func, list(t), Tout)
    return f


# ------------------------------------------------------------- the path --

@pinned
def test_the_kernel_path_is_taken_on_the_pinned_tensorflow():
    snapshot = pfb.stats()
    assert snapshot.eager_tensor_path == "kernel"
    assert snapshot.eager_tensor_missing == ()
    assert _library.eager_api_missing() == ()
    assert "DLPack" not in str(snapshot)


@pinned
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_call_makes_and_reads_its_tensors_without_dlpack(dlpack_calls, mode):
    x = tf.constant(np.arange(64, dtype=np.float32))
    func = lambda a, b: a + b  # noqa: E731
    if mode == "graph":
        y = in_graph(func)(x, x)
    else:
        y = pfb.py_function(func, [x, x], tf.float32)
    np.testing.assert_array_equal(y, np.arange(64) * 2)
    assert dlpack_calls == {"TFE_FromDlpackCapsule": 0, "TFE_ToDlpackCapsule": 0}


def test_string_inputs_and_results_still_convert():
    f = in_graph(lambda s: tf.strings.upper(s), Tout=tf.string)
    assert f(tf.constant([b"ab", b"c"])).numpy().tolist() == [b"AB", b"C"]


# ------------------------------------------------------------ zero-copy --

@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_inputs_and_identity_results_share_the_tf_buffer(mode):
    x = tf.constant(np.arange(1 << 18, dtype=np.float32))  # 1 MiB
    seen = []

    def body(a):
        seen.append(address(a))  # np.asarray of an EagerTensor views its buffer
        return a

    y = in_graph(body)(x) if mode == "graph" else pfb.py_function(body, [x], tf.float32)
    assert seen == [address(x)]
    assert address(y) == address(x)


def test_address_helper_does_not_copy():
    # What the tests above rely on: two views of one tensor show one address,
    # and a copy of it another.
    x = tf.constant(np.arange(1024, dtype=np.float32))
    assert address(x) == address(x)
    assert address(tf.identity(x) + 0) != address(x)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_fresh_eager_tensor_results_are_handed_over_without_a_copy(mode):
    x = tf.constant(np.arange(1 << 18, dtype=np.float32))
    made = []

    def body(a):
        out = a * 2
        made.append(address(out))
        return out

    y = in_graph(body)(x) if mode == "graph" else pfb.py_function(body, [x], tf.float32)
    assert address(y) == made[0] != address(x)
    np.testing.assert_array_equal(y, np.arange(1 << 18) * 2)


def test_one_result_used_for_two_outputs_shares_one_buffer():
    x = tf.constant(np.arange(256, dtype=np.float64))
    f = in_graph(lambda a: [a + 1, a + 1][:1] * 2, Tout=[tf.float64, tf.float64])
    y, z = f(x)
    assert address(y) == address(z)


# ------------------------------------------------------------ lifetimes --

def test_the_function_s_tensors_die_with_the_call():
    refs = []

    def body(a):
        out = a + 1
        refs.extend([weakref.ref(a), weakref.ref(out)])
        return out

    y = in_graph(body)(tf.constant(np.arange(16, dtype=np.float32)))
    collect()
    # The output is TF's tensor now: neither EagerTensor object is kept.
    assert [r() for r in refs] == [None, None]
    np.testing.assert_array_equal(y, np.arange(16) + 1)


def test_an_input_kept_by_the_function_outlives_the_op_s_tensors():
    kept = []

    def body(a):
        kept.append(a)
        return a * 3

    x = tf.constant(np.arange(4096, dtype=np.float32))
    y = in_graph(body)(x)
    del x, y
    collect()
    # The EagerTensor holds its own reference on TF's buffer.
    np.testing.assert_array_equal(kept[0].numpy(), np.arange(4096))


def test_threads_calling_at_once_get_their_own_results():
    f = in_graph(lambda a: a * 2)
    errors = []

    def run(k):
        try:
            for i in range(50):
                v = np.full(32, k * 1000 + i, dtype=np.float32)
                np.testing.assert_array_equal(f(tf.constant(v)), v * 2)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradients_through_the_kernel_path(mode):
    a0 = tf.constant([1.0, 2.0, 3.0])
    b0 = tf.constant([4.0, 5.0, 6.0])
    func = lambda a, b: a * b + b * b  # noqa: E731

    def grads(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = pfb.py_function(func, [a, b], tf.float32)
        return tape.gradient(y, [a, b])

    da, db = tf.function(grads)(a0, b0) if mode == "graph" else grads(a0, b0)
    np.testing.assert_allclose(da, b0)
    np.testing.assert_allclose(db, a0 + 2 * b0)


# A fresh interpreter: memory that would leak per call shows in its RSS.
_LEAK_SCRIPT = "kernel/eager_fast_path_leak.py"


def test_no_memory_grows_over_many_calls():
    proc = fresh_python(_LEAK_SCRIPT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown_mib = int(proc.stdout.strip().splitlines()[-1])
    assert grown_mib < 200, f"RSS grew by {grown_mib} MiB over 300 calls"


# ---------------------------------------------------- the DLPack fallback --

# Runs the same calls on whichever path the environment selects and prints
# what it saw; the test compares the two paths.
_PATH_SCRIPT = "kernel/eager_fast_path_path.py"


def _run_paths(pretend):
    env = dict(os.environ)
    env.pop(PRETEND, None)
    if pretend is not None:
        env[PRETEND] = pretend
    proc = fresh_python(_PATH_SCRIPT, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def kernel_path():
    return _run_paths(None)


@pytest.mark.parametrize("pretend, missing", [
    ("EagerTensorFromHandle", ["EagerTensorFromHandle"]),
    ("TensorHandle::Tensor,TFE_NewTensorHandle", ["TFE_NewTensorHandle", "TensorHandle::Tensor"]),
    ("*", list(EXPORTS)),
])
def test_missing_exports_fall_back_to_dlpack_with_the_same_results(kernel_path, pretend,
                                                                    missing):
    fast, fast_err = kernel_path
    slow, slow_err = _run_paths(pretend)
    assert fast["path"] == "kernel" and fast["missing"] == [] and not fast["table_says"]
    assert fast["dlpack_calls"] == {"from": 0, "to": 0}
    assert "does not export" not in fast_err
    # The fallback: named in stats() and its table, and taken.
    assert slow["path"] == "dlpack" and slow["missing"] == missing and slow["table_says"]
    assert slow["dlpack_calls"]["from"] > 0 and slow["dlpack_calls"]["to"] > 0
    # Said once per process, with what is missing.
    lines = [line for line in slow_err.splitlines() if "does not export" in line]
    assert len(lines) == 1 and ", ".join(missing) in lines[0]
    # The same results, zero-copy both ways, the same gradients and errors.
    for key in ("identity_zero_copy", "fresh_zero_copy", "a_plus_b", "gradient", "errors"):
        assert slow[key] == fast[key], key
    assert fast["identity_zero_copy"] and fast["fresh_zero_copy"]
    assert fast["a_plus_b"] == [0.0, 2.0, 4.0, 6.0]
    assert fast["gradient"] == [0.0, 2.0, 4.0, 6.0]
    assert all(e is not None and e[0] == "InvalidArgumentError" for e in fast["errors"])
