"""Saves into the folder argv[1] the SavedModels travel_saved_model_load.py
runs: declared functions, a torch one, an undeclared one, a graph naming
os.system, and two pickled closures that leave marker files when unpickled
and when run; prints whether torch was there, as JSON.

Run by tests/pipelines/test_travel_saved_model.py (tests/fresh_python.py),
with tests/ and tests/pipelines/ on the path."""
import json, pathlib, sys
import tensorflow as tf
import pyfunc_bridge as pfb
import travel_functions as tfn

out = pathlib.Path(sys.argv[1])
spec = tf.TensorSpec([None], tf.float32)

def save(name, fn):
    module = tf.Module()
    module.f = tf.function(fn, input_signature=[spec])
    tf.saved_model.save(module, str(out / name))

save("numpy", lambda x: pfb.numpy_function(tfn.times2, [x], tf.float32))
save("py", lambda x: pfb.py_function(tfn.cube, [x], tf.float32))

def with_gradient(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = pfb.py_function(tfn.cube, [x], tf.float32)
    return y, tape.gradient(y, x)
save("py_gradient", with_gradient)

try:
    import torch
    save("torch", lambda x: pfb.array_function(tfn.torch_softplus, [x], tf.float32,
                                               framework="torch"))
except ImportError:
    torch = None
save("undeclared", lambda x: pfb.numpy_function(tfn.undeclared_writer, [x], tf.float32))
# A graph naming a function nobody declared: os.system.
save("os_system", lambda x: pfb._library.ops().pyfunc_bridge_numpy_function(
    input=[x], key="os:system@0", reference="os:system", Tout=[tf.float32])[0])

class TouchesOnUnpickle:
    def __init__(self, path):
        self.path = path
    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)

def pickled(tag):
    spy = TouchesOnUnpickle(out / f"unpickled-{tag}")
    ran = out / f"ran-{tag}"
    offset = 1000.0
    def add_offset(a):
        spy  # captured, so unpickling the function unpickles it
        ran.touch()
        return a + offset
    return lambda x: pfb.numpy_function(add_offset, [x], tf.float32, portable=True)

save("pickled_a", pickled("a"))
save("pickled_b", pickled("b"))
print(json.dumps({"torch": torch is not None}))
