"""Loads the SavedModel py_function_gradient_places_saved_model_save.py
saved in argv[1] (its graphs rebuilt from their NodeDefs) and prints, as
JSON, a call and the gradients of a tape around each function, eagerly and
in a tf.function.

Run by tests/xla/test_xla_py_function_gradient_places.py
(tests/fresh_python.py), with tests/ and tests/xla/ on the path."""
import json
import sys

import tensorflow as tf
import pyfunc_bridge as pfb  # noqa: F401  (registers the ops)
import travel_functions  # noqa: F401  (declares the functions portable)
from xla_helpers import outer_tape

module = tf.saved_model.load(sys.argv[1])
x = tf.constant([1.0, 2.0, 3.0])
result = {"call": module.xla(x).numpy().tolist()}
for name in ("xla", "plain"):
    f = getattr(module, name)
    result[name] = outer_tape(f)(x).numpy().tolist()
    result[name + " in tf.function"] = tf.function(outer_tape(f))(x).numpy().tolist()
print(json.dumps(result))
