"""With auto-clustering on (TF_XLA_FLAGS, set by the test), numpy_function's
op joins the XLA cluster: prints a call's result, then two of the inputs
a function kept through later calls.

Run by tests/xla/test_xla.py (tests/fresh_python.py)."""
import tensorflow as tf
import pyfunc_bridge as pfb

tf.config.optimizer.set_jit("autoclustering")
kept = []


def keep(a):
    kept.append(a)
    return a + 1


def step(fn):
    @tf.function
    def f(x):
        return pfb.numpy_function(fn, [x * 2], tf.TensorSpec([2], tf.float32)) * 3
    return f


print(step(lambda a: a + 1)(tf.ones([2])).numpy().tolist())
kept_step = step(keep)
for i in range(20):
    kept_step(tf.fill([2], float(i)))
print([k.tolist() for k in kept[::19]])
