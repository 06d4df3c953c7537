"""Ctrl-C in a call that revives a broken pool (past its back-off), while the
first of its workers starts: the revival goes on, and every worker starts.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import signal, subprocess, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool.supervision import Supervisor
from pool_checks import broken_pool
Supervisor.retry_seconds = 0.2  # the back-off this script waits out
main = threading.main_thread().ident
pool = broken_pool(2, "revived pool", sys.argv[1])

def call():
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))

interrupted, starts = threading.Event(), []

def on_sigint(*_):
    interrupted.set()
    raise KeyboardInterrupt

real_popen = subprocess.Popen
class InterruptedStart(real_popen):
    def __init__(self, args, **kwargs):
        if not starts:  # the revival's first start: Ctrl-C in the call that waits for it
            starts.append(True)
            signal.pthread_kill(main, signal.SIGINT)
            interrupted.wait(60)
        super().__init__(args, **kwargs)

signal.signal(signal.SIGINT, on_sigint)
subprocess.Popen = InterruptedStart
while True:
    try:
        call()
        raise AssertionError("served before it was revived")
    except tf.errors.UnknownError:
        time.sleep(0.05)  # still broken: the back-off runs
    except KeyboardInterrupt:
        break
signal.signal(signal.SIGINT, signal.default_int_handler)
deadline = time.monotonic() + 60
while len(pool.pids()) < 2:  # the state: both workers started
    assert time.monotonic() < deadline, f"the revival started {pool.pids()}"
    time.sleep(0.01)
assert call() in pool.pids()
pool.close()
print("done")
