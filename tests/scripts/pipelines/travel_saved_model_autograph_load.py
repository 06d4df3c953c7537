"""Loads and runs the SavedModel travel_saved_model_autograph_save.py saved
in argv[1], pickles trusted; prints its value or its error as JSON.

Run by tests/pipelines/test_travel_saved_model.py (tests/fresh_python.py),
with tests/ and tests/pipelines/ on the path."""
import json, sys
import tensorflow as tf
import pyfunc_bridge as pfb
pfb.trust_pickled(True)
try:
    value = tf.saved_model.load(sys.argv[1]).f(tf.constant([1.0, 4.0, 9.0]))
    print(json.dumps({"ok": value.numpy().tolist()}))
except tf.errors.OpError as e:
    print(json.dumps({"error": e.message}))
