"""Loads the SavedModel xla_saved_model_save.py saved in argv[1], where only
the declared functions are known, and prints the results of its functions.

Run by tests/xla/test_xla.py (tests/fresh_python.py), with tests/ on the
path."""
import sys

import tensorflow as tf
import pyfunc_bridge as pfb  # noqa: F401  (registers the ops)
import travel_functions  # noqa: F401  (declares the functions portable)

module = tf.saved_model.load(sys.argv[1])
x = tf.constant([1.0, 2.0, 3.0])
print(module.numpy(x).numpy().tolist())
y, dy = module.grad(x)
print(y.numpy().tolist(), dy.numpy().tolist())
