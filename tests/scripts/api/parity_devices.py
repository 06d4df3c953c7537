"""Run by tests/api/test_api_parity_devices.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import pyfunc_bridge as pfb

def kind(x):
    return [type(x).__name__, str(x.dtype), list(np.shape(x))]

def py_function_cases(api):
    out = {}
    seen = []
    mode = ["eager"]
    devices = []  # [mode, the input's device, the device of the function's op]

    def square(a):
        seen.append(json.dumps(kind(a) + [a.device]))
        y = a * a
        devices.append([mode[0], a.device, y.device])
        return y

    x = tf.constant(3.0)
    with tf.device("/cpu:1"):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = api(square, [x], tf.float32)
        out["eager"] = [float(y), float(tape.gradient(y, x)), y.device]
    mode[0] = "tf.function"

    @tf.function
    def f(x):
        with tf.device("/cpu:1"):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = api(square, [x], tf.float32)
            return y, tape.gradient(y, x)
    y, g = f(x)
    out["tf.function"] = [float(y), float(g), y.device]
    mode[0] = "session"

    with tf.Graph().as_default():
        with tf.device("/cpu:1"):
            c = tf.constant(3.0)
            y = api(square, [c], tf.float32)
            (g,) = tf.gradients(y, [c])
        with tf.compat.v1.Session() as sess:
            out["session"] = [float(v) for v in sess.run([y, g])] + [y.device]
    mode[0] = "mirrored"

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = tf.Variable(2.0)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = api(square, [v * x], tf.float32)
        return y, tape.gradient(y, v)
    ys, gs = strategy.run(step, args=(tf.constant(3.0),))
    out["mirrored"] = [[float(t) for t in strategy.experimental_local_results(r)]
                       for r in (ys, gs)]
    out["received"] = sorted(set(seen))
    out["devices"] = sorted(set(map(tuple, devices)))
    return out

def numpy_cases(api):
    out = {}
    seen = []

    def double(a):
        seen.append(kind(a))
        return a * 2

    x = tf.constant(1.5)
    with tf.device("/cpu:1"):
        y = api(double, [x], tf.float32)
        out["eager"] = [float(y), y.device]

    @tf.function
    def f(x):
        with tf.device("/cpu:1"):
            return api(double, [x], tf.float32)
    out["tf.function"] = float(f(x))
    out["received"] = seen
    try:
        with tf.device("/cpu:1"):
            # (eagerly a dict is flattened, as TF's eager call does)
            api(lambda a: object(), [tf.constant([1.0])], tf.float32)
    except Exception as e:
        out["unsupported"] = [isinstance(e, ValueError),
                              isinstance(e, tf.errors.InternalError),
                              "Unsupported object type object" in str(e)]
    return out

def dlpack_cases():
    with tf.device("/cpu:1"):
        t = tf.constant([1.0, 2.0]) * 2
    exporter = pfb.to_dlpack(t)
    device = list(exporter.__dlpack_device__())
    capsule = exporter.__dlpack__(dl_device=(1, 0), max_version=(1, 0))
    back = pfb.from_dlpack(capsule)
    return [t.device, device, np.asarray(back).tolist()]

print("RESULT " + json.dumps({
    "dlpack": dlpack_cases(),
    "py_function": {"tf": py_function_cases(tf.py_function),
                    "pfb": py_function_cases(pfb.py_function)},
    "numpy_function": {"tf": numpy_cases(tf.numpy_function),
                       "pfb": numpy_cases(pfb.numpy_function)},
}))
