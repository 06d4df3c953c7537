"""The py_function kernels through their ops: zero-copy in and out, the
forward state that pairs each call with its gradient (when it is recorded,
how long it lives), the gradient op's error paths and the GPU registration."""
import gc

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import pyfunc_bridge as pfb
from conftest import address, collect

OP = "PyfuncBridge>PyFunction"
GRAD_OP = "PyfuncBridge>PyFunctionGrad"


def live_forward_states():
    conversion = pfb._library.conversion()
    return sum(1 for o in gc.get_objects() if type(o) is conversion._Forward)


def tensor_address(t):
    """Data address of a CPU EagerTensor (the NumPy view shares it)."""
    return address(t)


# ------------------------------------------------------------- zero-copy --

def test_inputs_are_eager_tensors_viewing_the_op_input():
    x = tf.constant(np.arange(1024, dtype=np.float32))
    seen = {}

    def body(a):
        seen["type"] = type(a)
        seen["address"] = tensor_address(a)
        return a * 2

    @tf.function
    def f(t):
        return pfb.py_function(body, [t], tf.float32)

    y = f(x)
    assert issubclass(seen["type"], tf.Tensor) and hasattr(seen["type"], "numpy")
    assert seen["address"] == tensor_address(x)
    np.testing.assert_array_equal(y, np.arange(1024) * 2)


def test_eager_tensor_results_are_zero_copy():
    x = tf.constant(np.arange(4096, dtype=np.float32))
    made = {}

    def body(a):
        out = a + 1
        made["address"] = tensor_address(out)
        return out

    @tf.function
    def f(t):
        return pfb.py_function(body, [t], tf.float32)

    y = f(x)
    assert tensor_address(y) == made["address"]
    np.testing.assert_array_equal(y, np.arange(4096) + 1)


def test_identity_result_shares_the_input_buffer():
    x = tf.constant(np.arange(256, dtype=np.float64))

    @tf.function
    def f(t):
        return pfb.py_function(lambda a: a, [t], tf.float64)

    assert tensor_address(f(x)) == tensor_address(x)


def test_numpy_results_are_copied_not_aliased():
    keep = np.arange(64, dtype=np.float32)

    @tf.function
    def f():
        return pfb.py_function(lambda: keep, [], tf.float32)

    y = f()
    assert not np.shares_memory(np.asarray(y), keep)
    keep[:] = -1
    np.testing.assert_array_equal(y, np.arange(64))


# ----------------------------------------------------------- forward state --

def test_no_state_without_a_tape_or_wired_gradient():
    collect()
    before = live_forward_states()
    x = tf.constant([1.0, 2.0])

    @tf.function
    def inference(t):
        return pfb.py_function(lambda a: a * a, [t], tf.float32)

    kept = [inference(x), pfb.py_function(lambda a: a * a, [x], tf.float32)]
    assert live_forward_states() == before
    del kept


def test_state_lives_as_long_as_the_tape():
    collect()
    before = live_forward_states()
    x = tf.constant([1.0, 2.0])
    tape = tf.GradientTape(persistent=True)
    with tape:
        tape.watch(x)
        y = pfb.py_function(lambda a: a * a, [x], tf.float32)
    assert live_forward_states() == before + 1
    np.testing.assert_allclose(tape.gradient(y, x), [2.0, 4.0])
    np.testing.assert_allclose(tape.gradient(y, x), [2.0, 4.0])  # still there
    del tape, y
    collect()
    assert live_forward_states() == before


def test_state_freed_after_gradient_of_non_persistent_tape():
    collect()
    before = live_forward_states()
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(lambda a: a * a * a, [x], tf.float32)
    assert float(tape.gradient(y, x)) == pytest.approx(27.0)
    del tape, y
    collect()
    assert live_forward_states() == before


def test_state_freed_when_tape_dropped_without_gradient():
    collect()
    before = live_forward_states()
    x = tf.constant(np.ones(1000, np.float32))
    for _ in range(20):
        with tf.GradientTape() as tape:
            tape.watch(x)
            pfb.py_function(lambda a: a * 2, [x], tf.float32)
    del tape
    collect()
    assert live_forward_states() == before


def raw_call(func, inputs, Tout, record=True):
    """The forward op run eagerly by hand: (outputs, forward state tensor)."""
    slot = pfb._library.conversion().eager_slot()
    slot.entry = pfb._registry.Entry(func, slot.key, record=record)
    try:
        return pfb._library.ops().pyfunc_bridge_py_function(
            input=inputs, key=slot.key, Tout=Tout)
    finally:
        slot.entry = None


def test_forward_output_is_a_scalar_variant():
    _, forward = raw_call(lambda a: [a], [tf.constant([1.0])], [tf.float32])
    assert forward.dtype == tf.variant and forward.shape == []
    # Gradient code may ask for zeros of any variant: an empty state.
    assert tf.zeros_like(forward).dtype == tf.variant


# --------------------------------------------------------- gradient op errors --

def _unrecorded_forward():
    return raw_call(lambda a: [a * a], [tf.constant([1.0, 2.0])], [tf.float32],
                    record=False)[1]


def test_gradient_of_unrecorded_call_fails_clearly():
    forward = _unrecorded_forward()
    with pytest.raises(tf.errors.FailedPreconditionError, match="recorded no forward state"):
        pfb._library.ops().pyfunc_bridge_py_function_grad(
            forward=forward, grads=[tf.ones([2])], Tdx=[tf.float32])


def test_gradient_op_rejects_non_scalar_forward():
    forward = tf.stack([_unrecorded_forward()] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a scalar"):
        pfb._library.ops().pyfunc_bridge_py_function_grad(
            forward=forward, grads=[tf.ones([2])], Tdx=[tf.float32])


def test_gradient_op_rejects_wrong_gradient_count():
    _, forward = raw_call(lambda a: [a * a], [tf.constant([1.0, 2.0])], [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 output gradients for 1"):
        pfb._library.ops().pyfunc_bridge_py_function_grad(
            forward=forward, grads=[tf.ones([2]), tf.ones([2])], Tdx=[tf.float32])


# ------------------------------------------------------------------- GPU --

def _registered_devices(op):
    return {k.device_type: k for k in kernels.get_registered_kernels_for_op(op).kernel}


@pytest.mark.parametrize("op", [OP, GRAD_OP])
def test_kernels_registered_for_cpu_and_gpu(op):
    pfb._library.ops()
    devices = _registered_devices(op)
    assert set(devices) >= {"CPU", "GPU"}
    # The forward state is a host object on every device.
    assert list(devices["GPU"].host_memory_arg) == ["forward"]


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(
        not tf.config.list_physical_devices("GPU"), reason="needs a GPU (none visible)")(test))


@gpu
def test_gpu_inputs_and_outputs_stay_on_device():
    with tf.device("/GPU:0"):
        x = tf.random.uniform([1 << 16])
    seen = {}

    def body(a):
        seen["device"] = a.device
        return a * 2

    @tf.function
    def f(t):
        with tf.device("/GPU:0"):
            return pfb.py_function(body, [t], tf.float32)

    y = f(x)
    assert "GPU" in seen["device"]
    assert "GPU" in y.device
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2)


@gpu
def test_gpu_gradient():
    with tf.device("/GPU:0"):
        x = tf.random.uniform([128])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(lambda a: tf.sin(a), [x], tf.float32)
        g = tape.gradient(y, x)
    np.testing.assert_allclose(g.numpy(), np.cos(x.numpy()), rtol=1e-5)
