"""8 M floats kept by a jit-compiled numpy_function over 21 calls: prints
whether each kept input still holds its call's values (reading a freed XLA
buffer of this size crashed).

Run by tests/xla/test_xla_kept_inputs.py (tests/fresh_python.py)."""
import tensorflow as tf
import pyfunc_bridge as pfb

n = 8 * 1024 * 1024
spec = tf.TensorSpec([n], tf.float32)
kept = []


def keep(a):
    kept.append(a)
    return a + 1


f = tf.function(lambda x: pfb.numpy_function(keep, [x], spec), jit_compile=True)
for i in range(21):
    f(tf.fill([n], float(i)))
print(all(float(k.min()) == float(k.max()) == i for i, k in enumerate(kept)))
