"""A TF1 program that never ran an eager op before its Session: prints the
result of a py_function whose function needs EagerTensors.

Run by tests/api/test_api_py_function.py (tests/fresh_python.py)."""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf  # noqa: E402
import pyfunc_bridge as pfb  # noqa: E402

with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None])
    y = pfb.py_function(lambda a: a * 2, [x], tf.float32)
    with tf.compat.v1.Session() as sess:
        print("RESULT", sess.run(y, {x: [1.5, 4.0]}).tolist())
