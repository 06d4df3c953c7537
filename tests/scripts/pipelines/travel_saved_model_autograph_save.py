"""Saves to argv[1] a tf.function that autograph converts, with a lambda
defined in it (autograph reads the source it converts, hence a file);
prints whether the lambda was converted, as JSON.

Run by tests/pipelines/test_travel_saved_model.py (tests/fresh_python.py),
with tests/ and tests/pipelines/ on the path."""
import json, sys
import numpy as np, tensorflow as tf
import pyfunc_bridge as pfb

seen = []

def record(func):
    seen.append(func)
    return func

root = 0.5
module = tf.Module()
module.f = tf.function(
    lambda x: pfb.numpy_function(record(lambda a: np.sqrt(a) + root), [x], tf.float32,
                                 portable=True),
    input_signature=[tf.TensorSpec([None], tf.float32)])
tf.saved_model.save(module, sys.argv[1])
print(json.dumps({"converted": "autograph_info__" in seen[0].__dict__}))
