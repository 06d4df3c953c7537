"""Saves to argv[1] a py_function of a declared function, jit-compiled and
not; prints the gradients a tape takes of them before saving, as JSON.

Run by tests/xla/test_xla_py_function_gradient_places.py
(tests/fresh_python.py), with tests/ on the path."""
import json
import sys

import tensorflow as tf
import pyfunc_bridge as pfb
import travel_functions as tfn

spec = tf.TensorSpec([3], tf.float32)
module = tf.Module()
for name, xla in (("xla", True), ("plain", False)):
    setattr(module, name, tf.function(
        lambda x: pfb.py_function(tfn.cube, [x], spec),
        input_signature=[spec], jit_compile=xla))
x = tf.constant([1.0, 2.0, 3.0])
grads = {}
for name in ("xla", "plain"):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = getattr(module, name)(x)
    grads[name] = tape.gradient(y, x).numpy().tolist()
tf.saved_model.save(module, sys.argv[1])
print(json.dumps(grads))
