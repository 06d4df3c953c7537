"""The bridge ops inside XLA: py_function (EagerTensor inputs, gradients
under a tape and symbolically) and a Keras model fit with jit_compile."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from xla_helpers import jit


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
