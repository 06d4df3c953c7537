"""Runs the same calls on whichever path the environment selects and prints
what it saw; the test compares the two paths.

Run by tests/kernel/test_kernel_eager_fast_path.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os, re
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
from tensorflow.python import pywrap_tfe
import pyfunc_bridge as pfb

dlpack = {"from": 0, "to": 0}
for name, key in (("TFE_FromDlpackCapsule", "from"), ("TFE_ToDlpackCapsule", "to")):
    def counting(*args, _real=getattr(pywrap_tfe, name), _key=key):
        dlpack[_key] += 1
        return _real(*args)
    setattr(pywrap_tfe, name, counting)

def addr(t):
    return np.asarray(t).__array_interface__["data"][0]

seen = []
def ident(a):
    seen.append(addr(a))
    return a
made = []
def fresh(a):
    out = a * 2
    made.append(addr(out))
    return out

x = tf.constant(np.arange(1 << 16, dtype=np.float32))
out = {}
y = tf.function(lambda t: pfb.py_function(ident, [t], tf.float32))(x)
out["identity_zero_copy"] = seen == [addr(x)] and addr(y) == addr(x)
y = tf.function(lambda t: pfb.py_function(fresh, [t], tf.float32))(x)
out["fresh_zero_copy"] = addr(y) == made[0]
out["a_plus_b"] = pfb.py_function(lambda a, b: a + b, [x, x], tf.float32).numpy()[:4].tolist()
with tf.GradientTape() as tape:
    tape.watch(x)
    y = pfb.py_function(lambda a: a * a, [x], tf.float32)
out["gradient"] = tape.gradient(y, x).numpy()[:4].tolist()

def error(func, Tout):
    try:
        tf.function(lambda t: pfb.py_function(func, [t], Tout))(x)
    except tf.errors.OpError as exc:
        found = re.search(r"(output \d+: |the function returned )[^\n]*", exc.message)
        return [type(exc).__name__, found.group(0) if found else exc.message.splitlines()[0]]
    return None

out["errors"] = [
    error(lambda a: tf.cast(a, tf.float64), tf.float32),
    error(lambda a: a, tf.TensorSpec([3], tf.float32)),
    error(lambda a: [a, a], tf.float32),
]
snapshot = pfb.stats()
pfb.stats()
out["path"] = snapshot.eager_tensor_path
out["missing"] = list(snapshot.eager_tensor_missing)
out["table_says"] = "DLPack" in str(snapshot)
out["dlpack_calls"] = dlpack
print(json.dumps(out))
