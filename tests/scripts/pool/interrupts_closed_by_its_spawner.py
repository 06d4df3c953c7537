"""close() run on the spawning thread while it starts one of that pool's
workers (as a finalizer run there would): it cannot wait for that start,
which is its own thread's, and the start ends (fails) once the pool closed.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, subprocess, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool.supervision import Supervisor
from pool_checks import broken_pool
Supervisor.retry_seconds = 0.2
pool = broken_pool(1, "self-ending pool", sys.argv[1])

def call():
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))

real_popen = subprocess.Popen
class ClosingStart(real_popen):
    def __init__(self, args, **kwargs):
        pool.close()  # on the spawning thread, in the middle of the revival's start
        super().__init__(args, **kwargs)
subprocess.Popen = ClosingStart
outcome = []

def calls():
    while True:
        try:
            call()
        except (tf.errors.UnknownError, tf.errors.FailedPreconditionError) as error:
            if "was closed" in str(error) or "is closed" in str(error):
                outcome.append(str(error))
                return
            time.sleep(0.05)  # still broken: the back-off runs

caller = threading.Thread(target=calls, daemon=True)
caller.start()
caller.join(60)
if not outcome:  # (the spawning thread waits for itself: so would the exit)
    sys.stderr.write("the call that revived the pool never returned\n")
    sys.stderr.flush()
    os._exit(1)
assert pool.closed and pool.pids() == [], pool.pids()
print("done")
