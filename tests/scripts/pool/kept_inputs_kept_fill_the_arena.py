"""Wrong values, or a hang (in a subprocess, then), where kept blocks are
reused or where a call waits for room that only a kept block could give.

Run by tests/pool/test_process_pool_kept_inputs.py in a fresh interpreter
(tests/fresh_python.py)."""
import threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, arena_bytes=64 << 10) as pool:
    keep = pf.keeper()
    for i in range(8):  # 16 KiB each: the first four fill the arena for good
        out = pfb.numpy_function(keep, [tf.fill([4096], float(i))], tf.float32,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.repeat(np.arange(i + 1.0), 4096))
    assert pool.free_input_bytes == 0
    # Calls from several threads at once: each finds the arena kept full and
    # sends its input pickled rather than waiting for room that never comes.
    results = {}
    def call(i):
        x = tf.fill([4096], float(i))
        results[i] = float(tf.reduce_sum(pfb.numpy_function(pf.double, [x], tf.float32,
                                                            executor=pool)))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: 2 * 4096.0 * i for i in range(4)}, results
    del keep
    import gc; gc.collect()
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=pool)
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
print("done")
