"""Daemon threads iterate tf.data maps through a pool (natively, after each
map's first calls) while the main thread ends.

Run by tests/pool/test_pool_route_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
pfb.enable_stats(True)
pool = pfb.ProcessPool(2, name="exit pool")
def iterate():
    dataset = tf.data.Dataset.range(1 << 40).map(
        lambda i: pfb.numpy_function(pf.identity, [tf.cast(i, tf.float32)], tf.float32,
                                     executor=pool), num_parallel_calls=4)
    for _ in dataset:
        pass
for _ in range(4):
    threading.Thread(target=iterate, daemon=True).start()
while "exit pool" not in pfb.stats().pools or pfb.stats().pools["exit pool"].calls < 256:
    time.sleep(0.01)  # past the maps' first calls (16 each at most): the rest go natively
time.sleep(0.5)
