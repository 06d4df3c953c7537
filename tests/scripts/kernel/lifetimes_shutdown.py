"""Run by tests/kernel/test_kernel_lifetimes.py in a fresh interpreter
(tests/fresh_python.py)."""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf
import pyfunc_bridge as pfb

@tf.function
def f(x):
    return pfb.numpy_function(lambda a: a * 2, [x], tf.float32)

# Outputs that still hold NumPy memory when the interpreter exits, and a
# pipeline whose prefetch thread may still be calling into the bridge.
kept = [f(tf.ones([1000])) for _ in range(10)]
kept.append(pfb.numpy_function(lambda: np.ones(10, np.float32), [], tf.float32))
ds = tf.data.Dataset.range(10**6).map(
    lambda i: pfb.numpy_function(lambda v: v + 1, [i], tf.int64),
    num_parallel_calls=4).prefetch(8)
it = iter(ds)
next(it)
print("done", flush=True)
