"""Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, threading
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
from pool_checks import child_exit_code

pickling, forked = threading.Event(), threading.Event()

class SlowToPickle:
    def __call__(self, a):
        return a
    def __reduce__(self):  # the parent's pickling is under way at the fork
        pickling.set()
        forked.wait(60)
        return (SlowToPickle, ())

pool = pfb.ProcessPool(1, name="parent")
caller = threading.Thread(target=lambda: pfb.numpy_function(
    SlowToPickle(), [tf.constant(1.0)], tf.float32, executor=pool))
caller.start()
assert pickling.wait(60), "the call never pickled its function"
child = os.fork()
if child == 0:
    y = pfb.numpy_function(np.negative, [tf.constant(2.0)], tf.float32, executor="process")
    os._exit(0 if float(y) == -2.0 else 3)
forked.set()
code = child_exit_code(child, "the child's first pool call waited for the parent's pickling")
assert code == 0, code
caller.join(60)
pool.close()
print("done")
