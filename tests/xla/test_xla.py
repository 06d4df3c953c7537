"""The bridge ops inside XLA (tf.function(jit_compile=True), Keras
jit_compile): each op lowers to an XLA custom call (src/kernel/xla_ops.cc)
whose handler runs the conversion layer's driver (src/kernel/xla_call.cc).
TF's own ops, and the bridge without XLA, are the oracles.  Errors and side
effects are in test_xla_errors.py, py_function and Keras in
test_xla_py_function.py."""
import ctypes
import re

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import TESTS
from pyfunc_bridge import _library
from xla_helpers import NUMERIC, flip, hlo, jit, run_script, sample


def test_auto_clustering_compiles_the_op_into_the_cluster():
    """With auto-clustering (on the CPU: --tf_xla_cpu_global_jit) the op
    joins the XLA cluster: an input it keeps is pfb's copy of XLA's buffer,
    which keeps its values through later calls."""
    lines = run_script("xla/xla_auto_clustering.py",
                       TF_XLA_FLAGS="--tf_xla_cpu_global_jit --tf_xla_min_cluster_size=1")
    assert lines[-2:] == ["[9.0, 9.0]", "[[0.0, 0.0], [38.0, 38.0]]"]


def test_ops_compile_when_xla_compiled_before_the_import():
    """tf2xla makes its JIT kernels once, at the first compilation: the
    library registers its own where that happened before it loaded."""
    lines = run_script("xla/xla_compiled_before_the_import.py")
    assert lines[-1] == "[-1.0, -1.0]"


def test_ffi_handlers_registered():
    lib = ctypes.CDLL(_library._KERNELS)
    lib.PyfuncBridge_XlaRegistrationErrors.restype = ctypes.c_char_p
    errors = lib.PyfuncBridge_XlaRegistrationErrors().decode()
    # The CPU handlers must register; CUDA's may not where XLA has no CUDA.
    assert "on Host" not in errors, errors


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_numpy_function_every_dtype_matches_non_xla(dtype):
    x = sample(dtype)
    spec = tf.TensorSpec(x.shape, dtype)
    f = lambda x: pfb.numpy_function(flip, [x], spec)  # noqa: E731
    got = jit(f)(x)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.numpy(), tf.function(f)(x).numpy())
    np.testing.assert_array_equal(got.numpy(), tf.reverse(x, [0]).numpy())


def test_custom_call_is_in_the_compiled_program():
    f = jit(lambda x: pfb.numpy_function(np.sinh, [x], tf.TensorSpec([4], tf.float32)) + 1)
    x = tf.linspace(0.0, 1.0, 4)
    text = hlo(f, x)
    assert re.search(r'custom_call_target="pyfunc_bridge\.call"', text), text
    assert "api_version=API_VERSION_TYPED_FFI" in text
    assert "custom_call_has_side_effect=true" in text
    np.testing.assert_allclose(f(x).numpy(), np.sinh(x.numpy()) + 1, rtol=1e-6)


def test_several_inputs_and_outputs_with_tf_ops_around():
    def both(a, b):
        return a + b, (a * b).astype(np.float64)

    @jit
    def f(a, b):
        s, p = pfb.numpy_function(both, [a * 2, b],
                                  [tf.TensorSpec([3], tf.float32),
                                   tf.TensorSpec([3], tf.float64)])
        return s - 1, p * 2

    a, b = tf.constant([1.0, 2.0, 3.0]), tf.constant([4.0, 5.0, 6.0])
    s, p = f(a, b)
    oracle = tf.numpy_function(both, [a * 2, b], [tf.float32, tf.float64])
    np.testing.assert_allclose(s.numpy(), oracle[0].numpy() - 1)
    np.testing.assert_allclose(p.numpy(), oracle[1].numpy() * 2)


def test_no_inputs_and_scalar_output():
    f = jit(lambda: pfb.numpy_function(lambda: np.float32(7), [], tf.TensorSpec([], tf.float32)))
    assert f().numpy() == 7


def test_py_func():
    @jit
    def f(x):
        return pfb.py_func(np.cumsum, [x], tf.TensorSpec([5], tf.float64))

    x = tf.constant([1.0, 2.0, 3.0, 4.0, 5.0], tf.float64)
    np.testing.assert_array_equal(f(x).numpy(), np.cumsum(x.numpy()))


def test_array_function_numpy():
    f = jit(lambda x: pfb.array_function(lambda a: a.T.copy(), [x],
                                         tf.TensorSpec([3, 2], tf.int32), framework="numpy"))
    x = sample(tf.int32)
    np.testing.assert_array_equal(f(x).numpy(), x.numpy().T)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_array_function_frameworks(framework):
    pytest.importorskip(framework)
    if framework == "torch":
        import torch
        fn = lambda a: torch.flip(a, [0]) * 2  # noqa: E731
    else:
        import jax
        import jax.numpy as jnp
        # JAX sets up its backends on first use: a plugin that fails there
        # (a GPU build without its CUDA libraries) keeps the exception, and
        # with it the frames of a function that was running, inputs included.
        jax.devices()
        fn = lambda a: jnp.flip(a, 0) * 2  # noqa: E731
    x = sample(tf.float32)
    f = lambda x: pfb.array_function(fn, [x], tf.TensorSpec([2, 3], tf.float32),  # noqa: E731
                                     framework=framework)
    np.testing.assert_array_equal(jit(f)(x).numpy(), tf.function(f)(x).numpy())


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_array_function_that_returns_its_input(framework):
    """A framework's pass-through result is a view of XLA's input buffer: it
    must be let go of when the call ends (JAX's own DLPack export holds it
    until jaxlib next collects its garbage)."""
    pytest.importorskip(framework)
    x = sample(tf.float32)
    f = lambda x: pfb.array_function(lambda a: a, [x], tf.TensorSpec([2, 3], tf.float32),  # noqa: E731
                                     framework=framework)
    for _ in range(3):
        np.testing.assert_array_equal(jit(f)(x).numpy(), x.numpy())


def test_results_are_copied_into_xla_buffers():
    """A result that keeps the input's memory (a pass-through) reaches the
    output by XLA's copy; the input is the call's own copy, writable to the
    function (read-only under copy=False)."""
    seen = []

    def keep(a):
        seen.append(a.flags.writeable)
        return a

    for copy in (None, False):
        f = jit(lambda x: pfb.numpy_function(keep, [x + 0], tf.TensorSpec([3], tf.float32),
                                             copy=copy) * 2)
        np.testing.assert_array_equal(f(tf.constant([1.0, 2.0, 3.0])).numpy(), [2, 4, 6])
    assert seen == [True, False]



# -------------------------------------------------------------- statistics --

def test_xla_calls_are_counted(stats_on):
    def counted(a):
        return a * 2

    f = jit(lambda x: pfb.numpy_function(counted, [x], tf.TensorSpec([4], tf.float32)))
    f(tf.ones([4]))
    f(tf.ones([4]))
    entry = pfb.stats().functions[counted.__qualname__]
    assert entry.calls == 2
    assert entry.bytes_zero_copy + entry.bytes_copied_total == 2 * (16 + 16)


def test_executor_calls_run_in_the_pool():
    import os

    with pfb.ProcessPool(1) as pool:
        f = jit(lambda x: pfb.numpy_function(lambda a: np.full(2, os.getpid(), np.int64) + a,
                                             [x], tf.TensorSpec([2], tf.int64),
                                             executor=pool))
        pids = f(tf.constant([0, 0], tf.int64)).numpy()
    assert pids[0] == pids[1] != os.getpid()


def test_saved_model_with_jit_compile_runs_in_a_fresh_process(tmp_path):
    """Saved with jit_compile=True functions, loaded where only the declared
    (portable) functions are known: XLA compiles in the loading process and
    the custom call resolves the function from the op's attributes."""
    path = str(tmp_path / "model")
    run_script("xla/xla_saved_model_save.py", path, PYTHONPATH=TESTS)
    lines = run_script("xla/xla_saved_model_load.py", path, PYTHONPATH=TESTS)
    assert lines[-2:] == ["[3.0, 5.0, 7.0]", "[1.0, 8.0, 27.0] [3.0, 12.0, 27.0]"]
