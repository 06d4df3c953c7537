"""close() is interrupted (SIGINT, as Ctrl-C) while it waits for a worker that
is stuck in a call; the next close() must end that worker and let go of the
pool's memfds.

Run by tests/pool/test_process_pool_close.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, os, signal, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

marks = sys.argv[1]
pool = pfb.ProcessPool(1, name="interrupted pool")
(pid,) = pool.pids()

def stuck_call():
    try:
        pfb.numpy_function(pf.hang, [tf.constant(600.0)], tf.int64, executor=pool)
    except Exception:
        pass  # (the pool's close fails it)

threading.Thread(target=stuck_call, daemon=True).start()
while not os.path.exists(os.path.join(marks, str(pid))):  # the worker is in the call
    time.sleep(0.01)

def interrupt_once_closing():
    while not pool.closed:  # close() has begun: it now waits for the stuck worker
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_closing, daemon=True).start()
try:
    pool.close()
except KeyboardInterrupt:
    pass
else:
    raise AssertionError("close() ended before the SIGINT came (it kills a stuck "
                         "worker after a grace period): the test did not interrupt it")
pool.close()  # finishes what the interrupted close began

def alive(p):
    try:
        os.kill(p, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for this test's purpose (its parent has not reaped it)
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

assert not alive(pid), f"worker {pid} still runs after the second close()"
assert pool.closed and pool.pids() == []
gc.collect()
fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
       if os.path.exists(f"/proc/self/fd/{fd}")]
assert not [t for t in fds if t.startswith("/memfd:interrupted pool")], fds
with open("/proc/self/maps") as f:
    maps = [line for line in f if "/memfd:interrupted pool" in line]
assert not maps, maps
print("done")
