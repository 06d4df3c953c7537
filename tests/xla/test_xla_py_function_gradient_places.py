"""py_function gradients under XLA taken outside the call's own graph: a tape
around the jit_compile=True function, tf.cond and tf.while_loop gradients,
a tape around a loaded SavedModel's function.  Each is checked against the
same computation without XLA."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import TESTS
from xla_helpers import jit, outer_tape, run_script


def square(a):
    return a * a


def cube(a):
    return a * a * a


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_tape_around_the_compiled_function(mode):
    # Also in eager mode, whose backward pass runs with TF's tapes stopped.
    f = jit(lambda x: pfb.py_function(square, [x], tf.TensorSpec([3], tf.float32)))
    grad = outer_tape(f) if mode == "eager" else tf.function(outer_tape(f))
    x = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_allclose(grad(x).numpy(), 2 * x.numpy())


def test_tape_around_several_outputs_one_unconnected_and_an_integer_one():
    def fn(a, n):
        return a * 2, tf.cast(a, tf.int32), a * a * tf.cast(n, tf.float32)

    def loss(x):
        _, _, c = pfb.py_function(fn, [x, tf.constant(3)],
                                  [tf.TensorSpec([3], tf.float32),
                                   tf.TensorSpec([3], tf.int32),
                                   tf.TensorSpec([3], tf.float32)])
        return tf.reduce_sum(c)

    x = tf.constant([1.0, 2.0, 3.0])
    got = outer_tape(jit(loss))(x)
    np.testing.assert_allclose(got.numpy(), outer_tape(tf.function(loss))(x).numpy())
    np.testing.assert_allclose(got.numpy(), 6 * x.numpy())


def test_cond_gradient():
    def run(x, p):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.cond(p, lambda: pfb.py_function(square, [x], tf.TensorSpec([3], tf.float32)),
                        lambda: pfb.py_function(cube, [x], tf.TensorSpec([3], tf.float32)))
        return tape.gradient(y, x)

    x = tf.constant([1.0, 2.0, 3.0])
    for p in (True, False):
        np.testing.assert_allclose(jit(run)(x, tf.constant(p)).numpy(),
                                   tf.function(run)(x, tf.constant(p)).numpy())


def test_while_loop_gradient():
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            body = lambda i, y: (i + 1, pfb.py_function(square, [y],
                                                        tf.TensorSpec([3], tf.float32)))
            # XLA accumulates a loop's values in lists of a fixed size.
            y = tf.while_loop(lambda i, y: i < 2, body, [0, x], maximum_iterations=2)[1]
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, x)

    x = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_allclose(jit(run)(x).numpy(), tf.function(run)(x).numpy())
    np.testing.assert_allclose(jit(run)(x).numpy(), 4 * x.numpy() ** 3)


def test_jacobian_inside_the_compiled_function_keeps_working():
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(square, [x], tf.TensorSpec([3], tf.float32))
        return tape.jacobian(y, x)

    x = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_allclose(jit(run)(x).numpy(), np.diag(2 * x.numpy()))


def test_tape_around_a_loaded_saved_model_function(tmp_path):
    """Loaded in a fresh process, a call's graph is rebuilt from its NodeDefs:
    the gradient there equals the one before saving, with and without XLA."""
    path = str(tmp_path / "model")
    before = json.loads(run_script("xla/py_function_gradient_places_saved_model_save.py", path,
                                   PYTHONPATH=TESTS)[-1])
    here = os.path.dirname(__file__)  # the script imports xla_helpers
    after = json.loads(run_script("xla/py_function_gradient_places_saved_model_load.py", path,
                                  PYTHONPATH=os.pathsep.join([TESTS, here]))[-1])
    analytic = [3.0, 12.0, 27.0]
    assert before == {"xla": analytic, "plain": analytic}
    assert after == {"call": [1.0, 8.0, 27.0],
                     "xla": analytic, "xla in tf.function": analytic,
                     "plain": analytic, "plain in tf.function": analytic}
