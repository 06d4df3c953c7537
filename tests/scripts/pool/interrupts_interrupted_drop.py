"""Ctrl-C while a dropped pool's __del__ closes it: nothing else can finish
that close, so it is finished there; every memfd of the pool goes.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, signal, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import memfds_of
armed = False

def on_alarm(*_):
    global armed
    if armed:  # once, and only inside the try below
        armed = False
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, on_alarm)
for step in range(25):
    pool = pfb.ProcessPool(1, arena_bytes=4096, name="dropped while interrupted")
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)  # its worker serves
    try:
        armed = True
        signal.setitimer(signal.ITIMER_REAL, 0.0005 + step * 0.001)
        del pool  # __del__ closes it
        time.sleep(0.1)
        armed = False
    except KeyboardInterrupt:
        pass
gc.collect()
assert memfds_of("dropped while interrupted") == ([], []), memfds_of("dropped while interrupted")
print("done")
