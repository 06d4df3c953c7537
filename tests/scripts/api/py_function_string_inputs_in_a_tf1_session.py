"""A TF1 program (eager execution off) runs pfb.py_function and
tf.py_function on string and float inputs in a Session, twice; prints both
results of both runs as JSON after "RESULT".

Run by tests/api/test_api_py_function.py (tests/fresh_python.py)."""
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf  # noqa: E402
import pyfunc_bridge as pfb  # noqa: E402
tf.compat.v1.disable_eager_execution()


def f(s, x):
    return [tf.strings.length(s), x * 2]


s = tf.constant(["ab", "cde"])
x = tf.constant([1.0, 2.0])
ours = pfb.py_function(f, [s, x], [tf.int32, tf.float32])
theirs = tf.py_function(f, [s, x], [tf.int32, tf.float32])
with tf.compat.v1.Session() as sess:
    runs = [[v.tolist() for v in sess.run(ours + theirs)] for _ in range(2)]
print("RESULT", json.dumps(runs))
