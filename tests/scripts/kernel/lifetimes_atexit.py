"""Run by tests/kernel/test_kernel_lifetimes.py in a fresh interpreter
(tests/fresh_python.py)."""
import atexit, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import pyfunc_bridge as pfb

def report():  # registered after the import, before the first bridge call
    y = pfb.numpy_function(lambda a: a + 1, [tf.constant(1.0)], tf.float32)
    print("atexit", float(y), flush=True)

atexit.register(report)
print("main", float(pfb.numpy_function(lambda a: a * 2, [tf.constant(1.0)], tf.float32)))
