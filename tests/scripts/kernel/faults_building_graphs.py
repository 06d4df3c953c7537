"""Two daemon threads build graphs without pause, as tracing does, when the
program ends: they are in TF's graph-building wrappers, which take the GIL
back in a noexcept destructor.  In a fresh interpreter every run aborted
before the kernel parked such threads (forked runs finalize too fast to show
it).

Run by tests/kernel/test_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import threading, time
import tensorflow as tf, pyfunc_bridge as pfb

def build():
    while True:
        with tf.Graph().as_default():
            x = pfb.numpy_function(lambda a: a + 1, [tf.constant([1.0, 2.0])], tf.float32)
            for _ in range(50):
                x = x + 1.0

for _ in range(2):
    threading.Thread(target=build, daemon=True).start()
time.sleep(0.5)
