"""Run by tests/api/test_api_import_cost.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
# TensorFlow itself imports jax when it is installed (and cloudpickle):
# only new imports count.
already = {m for m in ("torch", "jax", "jaxlib", "cloudpickle") if m in sys.modules}
POOL = ("pyfunc_bridge.pool.process_pool", "pyfunc_bridge.worker.start_worker",
        "pyfunc_bridge.pool.statistics", "pyfunc_bridge._pool",
        "pyfunc_bridge.pool.pickling", "cloudpickle")

def state():
    with open("/proc/self/maps") as f:
        kernels = sorted({line.split()[-1] for line in f if "/_kernels." in line})
    return {
        "conversion": "pyfunc_bridge._conversion" in sys.modules,
        "kernels": kernels,
        "heavy": sorted(m for m in ("torch", "jax", "jaxlib")
                        if m in sys.modules and m not in already),
        "pool": sorted(m for m in POOL if m in sys.modules and m not in already),
    }

real = tf.__version__
tf.__version__ = "2.20.0"
try:
    import pyfunc_bridge
    mismatch = None
except ImportError as e:
    mismatch = str(e)
tf.__version__ = real
for name in [m for m in sys.modules if m.startswith("pyfunc_bridge")]:
    del sys.modules[name]

# The op wrappers TF generates take 20-35 ms, four times the library's load.
wrappers_made = []
load_op_library = tf.load_op_library
tf.load_op_library = lambda path: wrappers_made.append(path) or load_op_library(path)
import pyfunc_bridge as pfb
from tensorflow.python.framework import op_def_registry
after_import = state()
registered = op_def_registry.get("PyfuncBridge>PyFunction") is not None
wrappers_at_import = len(wrappers_made)
not_in_dir = [name for name in pfb.__all__ if name not in dir(pfb)]
after_dir = state()
y = pfb.numpy_function(lambda a: a + 1, [tf.constant(1.0)], tf.float32)
after_use = state()
wrappers_at_use = len(wrappers_made)
stats = pfb.stats()  # (no pool used: the pools' statistics are not loaded for it)
after_stats = state()
import numpy as np
with pfb.ProcessPool(1) as pool:
    z = pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32, executor=pool)
after_pool = state()
print(json.dumps({"mismatch": mismatch, "after_import": after_import,
                  "not_in_dir": not_in_dir, "after_dir": after_dir,
                  "after_use": after_use, "value": float(y), "after_stats": after_stats,
                  "pools": list(stats.pools), "after_pool": after_pool,
                  "pool_value": float(z),
                  "registered": registered, "wrappers_at_import": wrappers_at_import,
                  "wrappers_at_use": wrappers_at_use}))
