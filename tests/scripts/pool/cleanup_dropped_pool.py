"""A pool that its user drops without close() (executor=pfb.ProcessPool()
inline) is collected, and its collection ends its workers and reader
threads.  Waits for states, by pid, with the script's timeout.

Run by tests/pool/test_process_pool_cleanup.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, threading, time, weakref
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import worker_alive as alive

def until(condition, what):
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)

pool = pfb.ProcessPool(2, name="dropped pool")
# Both paths: an eager call (Python's), a tf.data map (the kernel's rings).
pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
ds = tf.data.Dataset.range(20).map(
    lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool))
assert list(ds.as_numpy_iterator()) == list(range(1, 21))
pids = pool.pids()
ref = weakref.ref(pool)
del pool, ds
gc.collect()
assert ref() is None, gc.get_referrers(ref())
until(lambda: not [p for p in pids if alive(p)], f"workers {pids} of a dropped pool still run")
until(lambda: not [t for t in threading.enumerate() if t.name.startswith("dropped pool")],
      "the dropped pool's threads still run")
print("done")
