"""TF1 behaviour (disable_v2_behavior) for the whole process, hence a fresh
one: the legacy map in a Graph and Session and in TF1's eager mode, with
tf.compat.v1.py_func and pfb.py_func; prints the values of each as JSON
after "RESULT".

Run by tests/api/test_api_lifetimes.py (tests/fresh_python.py)."""
import gc, json
import tensorflow as tf
from tensorflow.python.eager import context
import pyfunc_bridge as pfb
tf.compat.v1.disable_v2_behavior()

def legacy_map(api):
    return tf.compat.v1.data.Dataset.range(4).map_with_legacy_function(
        lambda x: api(lambda v: v * 2, [x], tf.int64), num_parallel_calls=2)

out = {}
for side, api in [("tf", tf.compat.v1.py_func), ("pfb", pfb.py_func)]:
    with tf.Graph().as_default():
        nxt = tf.compat.v1.data.make_one_shot_iterator(legacy_map(api)).get_next()
        gc.collect()
        with tf.compat.v1.Session() as sess:
            out[side + " graph"] = [int(sess.run(nxt)) for _ in range(4)]
    with context.eager_mode():
        ds = legacy_map(api)
        gc.collect()
        out[side + " eager"] = [int(v) for v in ds.as_numpy_iterator()]
print("RESULT", json.dumps(out))
