"""XLA compiles once before pyfunc_bridge is imported, then a jit-compiled
numpy_function; prints its result.

Run by tests/xla/test_xla.py (tests/fresh_python.py)."""
import numpy as np
import tensorflow as tf

tf.function(lambda x: x * 2, jit_compile=True)(tf.ones([2]))
import pyfunc_bridge as pfb  # noqa: E402  (after the first compilation, the point)

f = tf.function(lambda x: pfb.numpy_function(
    np.negative, [x], tf.TensorSpec([2], tf.float32)), jit_compile=True)
print(f(tf.ones([2])).numpy().tolist())
