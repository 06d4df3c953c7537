"""Ctrl-C while ProcessPool() waits for its worker's start (here, a start
slowed until the caller has seen the interrupt, as on a loaded machine): the
start ends before the constructor raises, and its process with it; no
process starts later on the interrupted pool's descriptors, which by then
may be the next pool's.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import signal, subprocess, threading
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
main = threading.main_thread().ident
interrupted, raised = threading.Event(), threading.Event()
started = []  # (process, whether ProcessPool() had raised when it started)

def on_sigint(*_):
    interrupted.set()
    raise KeyboardInterrupt

real_popen = subprocess.Popen
class SlowStart(real_popen):
    def __init__(self, args, **kwargs):
        if not started:  # the first start: Ctrl-C in its caller, then the start goes on
            signal.pthread_kill(main, signal.SIGINT)
            interrupted.wait(60)
            raised.wait(2)  # (a start still under way when the constructor raised)
        super().__init__(args, **kwargs)
        started.append((self, raised.is_set()))

signal.signal(signal.SIGINT, on_sigint)
subprocess.Popen = SlowStart
try:
    pfb.ProcessPool(1, name="interrupted start", timeout=30)
    raise AssertionError("not interrupted")
except KeyboardInterrupt:
    raised.set()
assert all(process.poll() is not None for process, _ in started), "a process of it runs"
signal.signal(signal.SIGINT, signal.default_int_handler)
with pfb.ProcessPool(1, name="next pool") as pool:
    served = {int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))
              for _ in range(10)}
    assert served == set(pool.pids()), (served, pool.pids())
    interrupted_pools = [process for process, _ in started if process.pid not in pool.pids()]
assert not [process.pid for process, late in started
            if late and process in interrupted_pools], "started after it raised"
assert all(process.poll() is not None for process in interrupted_pools)
print("done")
