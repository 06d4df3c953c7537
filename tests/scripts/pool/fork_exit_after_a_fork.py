"""A fork while a TF thread of the parent is inside a bridge call (an in-
process numpy_function in a tf.function): that call is not in the child, and
the child's exit (sys.exit after a pool call) does not wait for it (it
waited 10 s, the bound of its wait for the calls under way).

Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, sys, threading
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
from pool_checks import child_exit_code
from pyfunc_bridge import _library

inside, forked = threading.Event(), threading.Event()

def waits(x):
    inside.set()
    forked.wait(60)
    return x

graph = tf.function(lambda x: pfb.numpy_function(waits, [x], tf.float32))
caller = threading.Thread(target=graph, args=(tf.constant(1.0),))
caller.start()
assert inside.wait(60), "the parent's call never began"
child = os.fork()
if child == 0:
    # (Eager only: TensorFlow runs a tf.function on threads that a child lacks.)
    y = pfb.numpy_function(np.negative, [tf.constant(2.0)], tf.float32, executor="process")
    drain = _library._begin_shutdown

    def exit_drain():  # the exit's wait for the bridge calls under way
        left = drain()
        if left:
            print(f"the child's exit waited for {left} calls", file=sys.stderr, flush=True)
            os._exit(4)
        return left
    _library._begin_shutdown = exit_drain
    sys.exit(0 if float(y) == -2.0 else 3)
code = child_exit_code(child, "the child's exit hung")
forked.set()
caller.join(60)
assert code == 0, code
print("done")
