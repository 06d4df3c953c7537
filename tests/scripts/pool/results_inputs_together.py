"""Hangs (in a subprocess, then) where a call holds some of its inputs' blocks
while it waits for room for the others.

Run by tests/pool/test_process_pool_results.py in a fresh interpreter
(tests/fresh_python.py)."""
import threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(2, arena_bytes=1 << 20) as pool:
    a = tf.ones([600_000], tf.uint8)  # two of them do not fit the arena together
    y = pfb.numpy_function(pf.add, [a, a], tf.uint8, executor=pool)
    assert int(tf.reduce_sum(tf.cast(y, tf.int64))) == 1_200_000
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
    b = tf.ones([400_000], tf.uint8)  # two calls at once: 4 blocks, 2.5 fit
    results, start = [], threading.Barrier(2)
    def call():
        start.wait()
        for _ in range(20):
            results.append(int(tf.reduce_sum(tf.cast(
                pfb.numpy_function(pf.add, [b, b], tf.uint8, executor=pool), tf.int64))))
    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [800_000] * 40, results
print("done")
