"""The bridge on a GPU: every mode with device, host-memory and mixed inputs,
and stream order both ways.  Skipped where TensorFlow sees no GPU."""
import threading

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="needs a GPU (none visible)")]

# Dtypes TF keeps in device memory on a GPU (int32 lives in host memory).
DEVICE_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
                 tf.int64, tf.uint8, tf.bool, tf.complex64, tf.complex128]
SHAPES = [[], [3], [2, 3]]


def _value(dtype, shape):
    n = int(np.prod(shape))
    raw = (np.arange(n) % 3) if dtype == tf.bool else np.arange(1, n + 1)
    return tf.cast(tf.reshape(tf.constant(raw), shape), dtype)


def _identity_and_fresh(x):
    return [x, tf.identity(x)]


def _sweep_run(api, mode, x, dtype):
    """[identity, fresh] of `x` through `api` in `mode`, as NumPy values, and
    the devices of the results where they are tensors."""
    def call(v):
        with tf.device("/GPU:0"):
            return api(_identity_and_fresh, [v], [dtype, dtype])
    if mode == "eager":
        out = call(x)
    elif mode == "function":
        out = tf.function(call)(x)
    elif mode == "tf.data":
        out = next(iter(tf.data.Dataset.from_tensors(x).map(lambda v: tuple(call(v)))))
    else:  # session
        with tf.Graph().as_default():
            v = tf.constant(x.numpy(), dtype)
            with tf.device("/GPU:0"):
                op = call(v)
            config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
            with tf.compat.v1.Session(config=config) as sess:
                return [np.asarray(r) for r in sess.run(op)], None
    return [r.numpy() for r in out], [r.device for r in out]


@pytest.mark.parametrize("mode", ["eager", "function", "tf.data", "session"])
@pytest.mark.parametrize("dtype", DEVICE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_py_function_on_gpu_tensors_matches_tensorflow(dtype, shape, mode):
    with tf.device("/GPU:0"):
        x = _value(dtype, shape)
    got, got_devices = _sweep_run(pfb.py_function, mode, x, dtype)
    want, want_devices = _sweep_run(tf.py_function, mode, x, dtype)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    if got_devices is not None:
        assert [("GPU" in d) for d in got_devices] == [("GPU" in d) for d in want_devices]


def test_eager_py_function_runs_the_callers_function_wherever_tf_runs_the_kernel():
    callers = []

    def body(a):
        callers.append(threading.get_ident())
        return a * 2

    def call_from_thread(value, out):
        with tf.device("/GPU:0"):
            out.append(float(pfb.py_function(body, [tf.constant(value)], tf.float32)))

    results = []
    threads = [threading.Thread(target=call_from_thread, args=(float(v), results))
               for v in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0.0, 2.0, 4.0, 6.0]
    with tf.device("/GPU:0"):
        assert float(pfb.py_function(lambda a: a + 1, [tf.constant(1.0)], tf.float32)) == 2.0


def test_eager_gradient_on_gpu():
    with tf.device("/GPU:0"):
        x = tf.constant([0.5, 1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(lambda a: a * a, [x], tf.float32)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [1.0, 2.0, 4.0])


def test_graph_gradient_on_gpu():
    @tf.function
    def grad(v):
        with tf.device("/GPU:0"):
            with tf.GradientTape() as tape:
                tape.watch(v)
                y = pfb.py_function(lambda a: a * a, [v], tf.float32)
            return tape.gradient(y, v)

    with tf.device("/GPU:0"):
        x = tf.constant([0.5, 1.0, 2.0])
    np.testing.assert_allclose(grad(x).numpy(), [1.0, 2.0, 4.0])


def _mixed(a, b, c):
    return a * 2, b + 1, c + b"!"


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_mixed_device_and_host_memory_inputs(mode):
    args = (tf.constant([1.5]), tf.constant([3], tf.int32), tf.constant([b"x"]))
    Tout = [tf.float32, tf.int32, tf.string]

    def run(api):
        def call(*xs):
            return api(_mixed, list(xs), Tout)
        return (tf.function(call) if mode == "graph" else call)(*args)

    got, want = run(pfb.py_function), run(tf.py_function)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_tf_data_and_session_on_a_gpu_machine():
    ds = tf.data.Dataset.range(40).map(
        lambda v: pfb.py_function(lambda a: a * 2, [v], tf.int64), num_parallel_calls=4)
    assert sum(int(v) for v in ds) == 2 * sum(range(40))
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        y = pfb.py_function(lambda a: a * 3, [x], tf.float32)
        with tf.compat.v1.Session() as sess:
            assert sess.run(y, {x: [1.0, 2.0]}).tolist() == [3.0, 6.0]


# ------------------------------------------------------------ stream order --

@pytest.fixture(scope="module")
def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


N = 1 << 22  # large enough that unordered work is seen unfinished
ROUNDS = 50


def _slow_fill(torch, value):
    """A tensor of `value`, written by queued kernels on a side stream."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.zeros(N, device="cuda")
        for _ in range(30):
            t = t + value / 30.0
    return t


def _side_stream_result(a, value):
    import torch
    return _slow_fill(torch, float(value))


def test_a_result_from_another_stream_is_complete_before_tf_reads_it(cuda_torch):
    # The function is defined outside the traced one: autograph would turn
    # its float() into a tf.cast.
    @tf.function
    def f(x, v):
        r = pfb.py_function(_side_stream_result, [x, v], tf.TensorSpec([N], tf.float32))
        return tf.reduce_min(r), tf.reduce_max(r)

    with tf.device("/GPU:0"):
        for i in range(1, ROUNDS + 1):
            lo, hi = f(tf.constant([1.0]), tf.constant(float(i)))
            np.testing.assert_allclose([float(lo), float(hi)], [i, i], rtol=1e-4)


def test_from_dlpack_orders_the_producers_stream_before_tf(cuda_torch):
    for i in range(1, ROUNDS + 1):
        t = _slow_fill(cuda_torch, float(i))
        x = pfb.from_dlpack(t)
        with tf.device("/GPU:0"):
            lo = float(tf.reduce_min(x))
        assert abs(lo - i) < 1e-3, (i, lo)


def test_to_dlpack_is_complete_for_a_consumer_on_another_stream(cuda_torch):
    for i in range(1, ROUNDS + 1):
        with tf.device("/GPU:0"):
            x = tf.fill([N], float(i))
            x = x * 1.0 + 0.0
        side = cuda_torch.cuda.Stream()
        with cuda_torch.cuda.stream(side):
            t = cuda_torch.from_dlpack(pfb.to_dlpack(x))
            lo = float(t.min())
        assert lo == float(i)


def test_gpu_inputs_reach_torch_finished_and_without_a_copy(cuda_torch):
    seen = {}

    def body(a):
        t = cuda_torch.from_dlpack(pfb.to_dlpack(a))
        seen["ptr"], seen["min"] = t.data_ptr(), float(t.min())
        return a

    @tf.function
    def f(v):
        with tf.device("/GPU:0"):
            x = tf.fill([N], v) * 1.0 + 0.0
            return x, pfb.py_function(body, [x], tf.float32)

    _, y = f(tf.constant(7.0))
    assert seen["min"] == 7.0
    assert seen["ptr"] == cuda_torch.from_dlpack(pfb.to_dlpack(y)).data_ptr()


# ---------------------------------------------------- array_function on a GPU --

def test_array_function_torch_gets_cuda_tensors_and_returns_them_without_a_copy(cuda_torch):
    seen = {}

    def double(a):
        seen["device"], seen["ptr"] = str(a.device), a.data_ptr()
        out = a * 2
        seen["out"] = out.data_ptr()
        return out

    with tf.device("/GPU:0"):
        x = tf.fill([1024], 3.0)
        y = pfb.array_function(double, [x], tf.float32, framework="torch")
    assert seen["device"] == "cuda:0"
    assert seen["ptr"] == cuda_torch.from_dlpack(pfb.to_dlpack(x)).data_ptr()
    assert "GPU" in y.device
    assert cuda_torch.from_dlpack(pfb.to_dlpack(y)).data_ptr() == seen["out"]
    np.testing.assert_array_equal(y.numpy(), np.full(1024, 6.0, np.float32))


def test_array_function_cupy_and_jax_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    with tf.device("/GPU:0"):
        x = tf.fill([256], 2.0)
        y = pfb.array_function(lambda a: cupy.sqrt(a * 8), [x], tf.float32,
                               framework="cupy")
    assert "GPU" in y.device
    np.testing.assert_allclose(y.numpy(), np.full(256, 4.0))
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        return
    with tf.device("/GPU:0"):
        z = pfb.array_function(lambda a: a + 1, [x], tf.float32, framework="jax")
    np.testing.assert_allclose(z.numpy(), np.full(256, 3.0))


# ------------------------------------------------------------- XLA on a GPU --

def _xla_gpu_or_skip():
    """TF's own XLA on this GPU, as the control: the stand-in CUDA libraries of
    a trimmed TF build may leave XLA unable to compile there at all."""
    @tf.function(jit_compile=True)
    def bare(v):
        return v * 2.0
    with tf.device("/GPU:0"):
        try:
            bare(tf.ones([4])).numpy()
        except (tf.errors.OpError, RuntimeError) as e:
            pytest.skip(f"TensorFlow's XLA does not compile on this GPU: {str(e)[:200]}")


def test_py_function_under_xla_on_the_gpu():
    _xla_gpu_or_skip()
    seen = []

    def body(a):
        seen.append(a.device)
        return a * 3

    @tf.function(jit_compile=True)
    def f(v):
        return pfb.py_function(body, [v * 1.0], tf.TensorSpec([4], tf.float32)) + 1.0

    with tf.device("/GPU:0"):
        for i in range(1, ROUNDS + 1):
            y = f(tf.fill([4], float(i)))
            np.testing.assert_array_equal(y.numpy(), np.full(4, 3.0 * i + 1))
    assert seen


def test_array_function_torch_under_xla_on_the_gpu(cuda_torch):
    _xla_gpu_or_skip()

    @tf.function(jit_compile=True)
    def f(v):
        return pfb.array_function(lambda a: a * 2, [v + 0.0], tf.TensorSpec([N], tf.float32),
                                  framework="torch") - 1.0

    with tf.device("/GPU:0"):
        for i in range(1, 11):
            y = f(tf.fill([N], float(i)))
            assert float(tf.reduce_min(y)) == float(tf.reduce_max(y)) == 2.0 * i - 1


# ----------------------------------------------------------------- benchmark --

def test_gpu_overhead_benchmark_reports_a_ratio_on_the_gpu():
    import re

    from conftest import GPU_ENV, ROOT as root
    from fresh_python import fresh_python
    run = fresh_python("-m benchmarks.gpu_overhead", "--mode", "smoke", cwd=root, env=GPU_ENV,
                       timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "GPU:0" in run.stdout, run.stdout
    assert re.search(r"py_function identity\s+\S+\s+\S+\s+>?[\d.]+x", run.stdout), run.stdout
