"""Saves to argv[1] jit_compile=True functions of declared (portable)
functions: a numpy_function and a py_function with its gradient.

Run by tests/xla/test_xla.py (tests/fresh_python.py), with tests/ on the
path."""
import sys

import tensorflow as tf
import pyfunc_bridge as pfb
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
tf.saved_model.save(module, sys.argv[1])
