"""Prints one JSON line: what each call returned.  "start": async before the
context exists (every thread's default executor is async); "after": async
set once it exists (only the main thread's executor is).

Run by tests/kernel/test_kernel_async_eager.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os, sys, threading
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
import pyfunc_bridge as pfb

if sys.argv[1] == "after":
    tf.constant(1.0) + 1.0
tf.config.experimental.set_synchronous_execution(False)
one = tf.constant(1)
caller = threading.get_ident()
seen = {}

def with_tf_ops(a):
    return tf.constant(a + 1).numpy()

def where(a):  # TF's eager numpy_function calls it on the caller's thread
    return np.int32(threading.get_ident() == caller)

seen["numpy_function with TF ops"] = int(pfb.numpy_function(with_tf_ops, [one], tf.int32))
seen["numpy_function on the caller's thread"] = int(pfb.numpy_function(where, [one], tf.int32))
lock_held = threading.RLock()

def takes_rlock(a):  # the caller holds it: only its own thread takes it
    with lock_held:
        return a + 1
with lock_held:
    seen["numpy_function, caller holds an RLock"] = int(
        pfb.numpy_function(takes_rlock, [one], tf.int32))
seen["py_function"] = int(pfb.py_function(lambda a: a + 1, [one], tf.int32))
seen["py_function in tf.function"] = int(
    tf.function(lambda x: pfb.py_function(lambda a: a + 1, [x], tf.int32))(one))
x = tf.constant(3.0)
with tf.GradientTape() as tape:
    tape.watch(x)
    y = pfb.py_function(lambda a: a * a, [x], tf.float32)
seen["py_function gradient"] = float(tape.gradient(y, x))
print(json.dumps(seen))
