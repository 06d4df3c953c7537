"""The bridge ops inside XLA (tf.function(jit_compile=True), Keras
jit_compile): each op lowers to an XLA custom call (src/kernel/xla_ops.cc)
whose handler runs the conversion layer's driver (src/kernel/xla_call.cc).
TF's own ops, and the bridge without XLA, are the oracles."""
import ctypes
import os
import re
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import ROOT, TESTS, script_env
from pyfunc_bridge import _library

NUMERIC = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
           tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool,
           tf.complex64, tf.complex128]


def _value(dtype, shape=(2, 3)):
    n = int(np.prod(shape))
    if dtype == tf.bool:
        return tf.constant(np.arange(n).reshape(shape) % 3 == 0)
    if dtype.is_complex:
        return tf.cast(tf.reshape(tf.range(n, dtype=tf.float64), shape), dtype) * (1 + 2j)
    return tf.cast(tf.reshape(tf.range(n), shape), dtype)


def _flip(a):
    # Reversed rows, a new array: for every dtype, bool and bfloat16 included.
    return np.ascontiguousarray(a[::-1])


def jit(fn):
    return tf.function(fn, jit_compile=True)


def hlo(fn, *args):
    return fn.experimental_get_compiler_ir(*args)(stage="hlo")


def _run_script(code, PYTHONPATH=None, **env):
    """`code` in a fresh interpreter (this checkout's package first on its
    path, then `PYTHONPATH`); its stdout's lines."""
    env = script_env(*[p for p in (ROOT, PYTHONPATH) if p], TF_CPP_MIN_LOG_LEVEL="2",
                     CUDA_VISIBLE_DEVICES="", **env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_auto_clustering_compiles_the_op_into_the_cluster():
    """With auto-clustering (on the CPU: --tf_xla_cpu_global_jit) the op
    joins the XLA cluster: its input is XLA's buffer, which a function may
    not keep (only under XLA is that an error)."""
    lines = _run_script("""
        import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
        tf.config.optimizer.set_jit("autoclustering")
        kept = []
        def keep(a):
            kept.append(a)
            return a + 1
        def step(fn):
            @tf.function
            def f(x):
                return pfb.numpy_function(fn, [x * 2], tf.TensorSpec([2], tf.float32)) * 3
            return f
        print(step(lambda a: a + 1)(tf.ones([2])).numpy().tolist())
        try:
            step(keep)(tf.ones([2]))
        except tf.errors.FailedPreconditionError as e:
            print("kept a reference" in str(e))
        """, TF_XLA_FLAGS="--tf_xla_cpu_global_jit --tf_xla_min_cluster_size=1")
    assert lines[-2:] == ["[9.0, 9.0]", "True"]


def test_ops_compile_when_xla_compiled_before_the_import():
    """tf2xla makes its JIT kernels once, at the first compilation: the
    library registers its own where that happened before it loaded."""
    lines = _run_script("""
        import numpy as np, tensorflow as tf
        tf.function(lambda x: x * 2, jit_compile=True)(tf.ones([2]))
        import pyfunc_bridge as pfb
        f = tf.function(lambda x: pfb.numpy_function(
            np.negative, [x], tf.TensorSpec([2], tf.float32)), jit_compile=True)
        print(f(tf.ones([2])).numpy().tolist())
        """)
    assert lines[-1] == "[-1.0, -1.0]"


def test_ffi_handlers_registered():
    lib = ctypes.CDLL(_library._KERNELS)
    lib.PyfuncBridge_XlaRegistrationErrors.restype = ctypes.c_char_p
    errors = lib.PyfuncBridge_XlaRegistrationErrors().decode()
    # The CPU handlers must register; CUDA's may not where XLA has no CUDA.
    assert "on Host" not in errors, errors


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_numpy_function_every_dtype_matches_non_xla(dtype):
    x = _value(dtype)
    spec = tf.TensorSpec(x.shape, dtype)
    f = lambda x: pfb.numpy_function(_flip, [x], spec)  # noqa: E731
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
    x = _value(tf.int32)
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
    x = _value(tf.float32)
    f = lambda x: pfb.array_function(fn, [x], tf.TensorSpec([2, 3], tf.float32),  # noqa: E731
                                     framework=framework)
    np.testing.assert_array_equal(jit(f)(x).numpy(), tf.function(f)(x).numpy())


def test_results_are_copied_into_xla_buffers():
    """A result that keeps the input's memory (a pass-through) reaches the
    output by XLA's copy, and the input is XLA's, read-only to the function."""
    seen = {}

    def keep(a):
        seen["writeable"] = a.flags.writeable
        return a

    f = jit(lambda x: pfb.numpy_function(keep, [x + 0], tf.TensorSpec([3], tf.float32)) * 2)
    np.testing.assert_array_equal(f(tf.constant([1.0, 2.0, 3.0])).numpy(), [2, 4, 6])
    assert seen["writeable"] is False


# ------------------------------------------------------------------ errors --

def test_exception_reaches_the_caller_with_its_traceback():
    def boom(a):
        raise ValueError("boom from inside XLA")

    f = jit(lambda x: pfb.numpy_function(boom, [x], tf.TensorSpec([2], tf.float32)))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        f(tf.constant([1.0, 2.0]))
    message = str(info.value)
    assert "ValueError: boom from inside XLA" in message
    assert "in boom" in message  # the traceback's frame


def test_exception_class_maps_as_without_xla():
    def missing(a):
        raise KeyError("k")

    spec = tf.TensorSpec([2], tf.float32)
    x = tf.constant([1.0, 2.0])
    f = lambda x: pfb.numpy_function(missing, [x], spec)  # noqa: E731
    with pytest.raises(tf.errors.OpError) as plain:
        tf.function(f)(x)
    with pytest.raises(tf.errors.OpError) as compiled:
        jit(f)(x)
    assert type(compiled.value) is type(plain.value)


@pytest.mark.parametrize("result, words", [
    (lambda a: a.astype(np.float64), "float64"),
    (lambda a: np.zeros([3], np.float32), "shape"),
    (lambda a: np.zeros([2, 1], np.float32), "shape"),
])
def test_wrong_result_is_the_usual_error(result, words):
    spec = tf.TensorSpec([2], tf.float32)
    x = tf.constant([1.0, 2.0])
    f = lambda x: pfb.numpy_function(result, [x], spec)  # noqa: E731
    with pytest.raises(tf.errors.OpError) as plain:
        tf.function(f)(x)
    with pytest.raises(tf.errors.OpError) as compiled:
        jit(f)(x)
    assert type(compiled.value) is type(plain.value)
    assert words in str(compiled.value)
    # The bridge's own words, as without XLA.
    words = re.search(r"pyfunc_bridge: [^\[\n]*", str(plain.value)).group(0).strip()
    assert words in str(compiled.value)


@pytest.mark.parametrize("Tout, words", [
    (tf.float32, "declares no shape"),
    (tf.TensorSpec(None, tf.float32), "declares no shape"),
    (tf.TensorSpec([None], tf.float32), "unknown dimensions"),
])
def test_undeclared_shape_fails_at_compile_time(Tout, words):
    calls = []

    def fn(a):
        calls.append(1)
        return a

    f = jit(lambda x: pfb.numpy_function(fn, [x], Tout, name="undeclared"))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        f(tf.constant([1.0, 2.0]))
    message = str(info.value)
    assert words in message
    assert "undeclared" in message  # the node
    assert "Tout=tf.TensorSpec(shape, dtype)" in message
    assert calls == []  # never ran: compiling failed


def test_strings_are_refused_at_compile_time():
    f = jit(lambda s: pfb.numpy_function(lambda a: a, [s], tf.TensorSpec([1], tf.string)))
    with pytest.raises(tf.errors.OpError, match="XLA_CPU_JIT|string"):
        f(tf.constant(["a"]))


def test_keeping_an_input_past_the_call_is_an_error():
    kept = []

    def keep(a):
        kept.append(a)
        return a + 1

    f = jit(lambda x: pfb.numpy_function(keep, [x], tf.TensorSpec([2], tf.float32)))
    with pytest.raises(tf.errors.FailedPreconditionError, match="kept a reference"):
        f(tf.constant([1.0, 2.0]))
    kept.clear()
    copied = jit(lambda x: pfb.numpy_function(keep, [x], tf.TensorSpec([2], tf.float32),
                                              copy=True))
    np.testing.assert_array_equal(copied(tf.constant([1.0, 2.0])).numpy(), [2, 3])


def test_an_input_released_just_after_the_call_by_another_thread_is_no_error():
    """JAX computes asynchronously and drops its hold on an input's buffer on
    its own thread just after the result is ready: a hold let go within a
    moment of the return is no kept reference."""
    import threading
    handed = []

    def hand_off(a):
        held = threading.Event()

        def hold(view):
            held.set()
            threading.Event().wait(0.02)  # still held after the call returned
            del view
        thread = threading.Thread(target=hold, args=(a,))
        handed.append(thread)
        del a
        thread.start()
        held.wait()
        return np.ones(2, np.float32)

    f = jit(lambda x: pfb.numpy_function(hand_off, [x], tf.TensorSpec([2], tf.float32)))
    for _ in range(5):
        np.testing.assert_array_equal(f(tf.constant([1.0, 2.0])).numpy(), [1, 1])
    for thread in handed:
        thread.join()


# ------------------------------------------------------------ side effects --

def test_stateful_calls_are_neither_merged_nor_dropped():
    count = []

    def tick(a):
        count.append(1)
        return a

    spec = tf.TensorSpec([2], tf.float32)

    @jit
    def f(x):
        pfb.numpy_function(tick, [x], spec)  # result unused
        a = pfb.numpy_function(tick, [x], spec)
        b = pfb.numpy_function(tick, [x], spec)  # equal to `a`'s call
        return a + b

    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(f(x).numpy(), [2, 4])
    assert len(count) == 3
    f(x)
    assert len(count) == 6
    assert hlo(f, x).count('custom_call_target="pyfunc_bridge.call"') == 3


def test_dependent_calls_run_in_order():
    order = []

    def step(name):
        def fn(a):
            order.append(name)
            return a + 1
        return fn

    spec = tf.TensorSpec([], tf.int32)

    @jit
    def f(x):
        a = pfb.numpy_function(step("first"), [x], spec)
        b = pfb.numpy_function(step("second"), [a], spec)
        return pfb.numpy_function(step("third"), [b * 2], spec)

    assert f(tf.constant(1)).numpy() == 7
    assert order == ["first", "second", "third"]


# -------------------------------------------------------------- py_function --

def test_py_function_receives_eager_tensors():
    kinds = []

    def fn(a, b):
        kinds.append((type(a).__name__, a.device))
        return tf.matmul(a, b), tf.reduce_sum(a)

    @jit
    def f(a, b):
        return pfb.py_function(fn, [a, b], [tf.TensorSpec([2, 2], tf.float32),
                                            tf.TensorSpec([], tf.float32)])

    a = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    m, s = f(a, a)
    np.testing.assert_allclose(m.numpy(), (a @ a).numpy())
    assert s.numpy() == 10
    assert kinds[0][0] == "EagerTensor" and "CPU" in kinds[0][1]


def test_py_function_gradient_under_a_tape():
    def cube(x):
        return x * x * x

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(cube, [x], tf.TensorSpec([3], tf.float32))
            loss = tf.reduce_sum(y * tf.constant([1.0, 2.0, 3.0]))
        return loss, tape.gradient(loss, x)

    x = tf.constant([1.0, 2.0, 3.0])
    loss, grad = jit(run)(x)
    plain_loss, plain_grad = tf.function(run)(x)
    np.testing.assert_allclose(loss.numpy(), plain_loss.numpy())
    np.testing.assert_allclose(grad.numpy(), plain_grad.numpy())
    np.testing.assert_allclose(grad.numpy(), 3 * x.numpy() ** 2 * [1, 2, 3])


def test_py_function_gradient_with_integer_input_and_two_outputs():
    def fn(x, n):
        return x * tf.cast(n, tf.float32), tf.sin(x)

    def run(x, n):
        with tf.GradientTape() as tape:
            tape.watch(x)
            a, b = pfb.py_function(fn, [x, n], [tf.TensorSpec([2], tf.float32),
                                                tf.TensorSpec([2], tf.float32)])
            loss = tf.reduce_sum(a) + tf.reduce_sum(b)
        return tape.gradient(loss, x)

    x, n = tf.constant([0.5, 1.0]), tf.constant(3)
    np.testing.assert_allclose(jit(run)(x, n).numpy(), tf.function(run)(x, n).numpy(),
                               rtol=1e-6)


def test_py_function_symbolic_gradients():
    """tf.gradients (no tape) inside a jit_compile=True function."""
    def run(x):
        y = pfb.py_function(lambda a: a * a, [x], tf.TensorSpec([2], tf.float32))
        return tf.gradients(y, x)[0]

    x = tf.constant([1.0, 2.0])
    np.testing.assert_allclose(jit(run)(x).numpy(), tf.function(run)(x).numpy())
    np.testing.assert_allclose(jit(run)(x).numpy(), [2.0, 4.0])


# ------------------------------------------------------------------- Keras --

def test_keras_fit_jit_compile_same_losses():
    keras = pytest.importorskip("keras")

    class Scale(keras.layers.Layer):
        def call(self, x):
            # A shape-declared function: the batch is fixed (8), XLA needs it.
            return pfb.numpy_function(lambda a: a * np.float32(0.5), [x],
                                      tf.TensorSpec([8, 4], tf.float32))

    def losses(jit_compile):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,), batch_size=8), Scale(),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                      jit_compile=jit_compile)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(32, 4)).astype(np.float32)
        y = rng.normal(size=(32, 1)).astype(np.float32)
        history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
        return history.history["loss"]

    compiled, plain = losses(True), losses(False)
    np.testing.assert_allclose(compiled, plain, rtol=1e-5)


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
    _run_script(f"""
        import tensorflow as tf, pyfunc_bridge as pfb
        import travel_functions as tfn
        spec = tf.TensorSpec([3], tf.float32)
        module = tf.Module()
        module.numpy = tf.function(
            lambda x: pfb.numpy_function(tfn.times2, [x], spec) + 1,
            input_signature=[spec], jit_compile=True)
        def grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = pfb.py_function(tfn.cube, [x], spec)
            return y, tape.gradient(y, x)
        module.grad = tf.function(grad, input_signature=[spec], jit_compile=True)
        tf.saved_model.save(module, {path!r})
        """, PYTHONPATH=TESTS)
    lines = _run_script(f"""
        import tensorflow as tf, pyfunc_bridge as pfb
        import travel_functions  # declares the functions portable
        module = tf.saved_model.load({path!r})
        x = tf.constant([1.0, 2.0, 3.0])
        print(module.numpy(x).numpy().tolist())
        y, dy = module.grad(x)
        print(y.numpy().tolist(), dy.numpy().tolist())
        """, PYTHONPATH=TESTS)
    assert lines[-2:] == ["[3.0, 5.0, 7.0]", "[1.0, 8.0, 27.0] [3.0, 12.0, 27.0]"]
