"""Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
pool = pfb.ProcessPool(2, name="stuck wait lock")
pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
# What a KeyboardInterrupt between Popen.wait's acquire and its try leaves:
# the process's wait lock held for good.
workers = list(pool._supervisor.workers)
assert len(workers) == 2
for worker in workers:
    worker.proc._waitpid_lock.acquire()
pool.close()  # kills and reaps the workers without Popen.wait
assert all(w.proc.returncode is not None for w in workers)
print("done")
