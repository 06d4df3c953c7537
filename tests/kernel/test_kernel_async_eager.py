"""Calls under TensorFlow's async eager execution
(`tf.config.experimental.set_synchronous_execution(False)`): an async
executor runs ops on a thread of its own, so a function that ran there and
waited for its own TF ops (queued behind it) or for a lock its caller holds
would wait for ever.  Each mode runs in a fresh interpreter (the mode is
per process, and a hang must end in the timeout)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, script_env

# Prints one JSON line: what each call returned.  "start": async before the
# context exists (every thread's default executor is async); "after": async
# set once it exists (only the main thread's executor is).
_SCRIPT = r"""
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
"""


@pytest.mark.parametrize("made_async", ["start", "after"])
def test_async_eager_calls_finish_with_the_values_of_sync_ones(made_async):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, made_async],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=script_env(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "numpy_function with TF ops": 2,
        "numpy_function on the caller's thread": 1,
        "numpy_function, caller holds an RLock": 2,
        "py_function": 2,
        "py_function in tf.function": 2,
        "py_function gradient": 6.0,
    }
