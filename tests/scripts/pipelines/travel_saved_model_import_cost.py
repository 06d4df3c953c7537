"""Times `import pyfunc_bridge` after TensorFlow's and prints it as JSON,
with whether the ops are registered and the conversion module loaded.

Run by tests/pipelines/test_travel_saved_model.py (tests/fresh_python.py),
with tests/ and tests/pipelines/ on the path."""
import json, sys, time
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
start = time.perf_counter()
import pyfunc_bridge
ms = (time.perf_counter() - start) * 1e3
names = ["PyfuncBridge>NumpyFunction", "PyfuncBridge>NumpyFunctionStateless",
         "PyfuncBridge>PyFunction", "PyfuncBridge>PyFunctionGrad"]
print(json.dumps({"ms": ms,
                  "registered": [op_def_registry.get(n) is not None for n in names],
                  "conversion": "pyfunc_bridge._conversion" in sys.modules}))
