"""A hang (in a subprocess, then) where a worker hands back more input blocks
at once than its reply ring holds: the function that kept 5,000 inputs is
forgotten, and the worker's wait for room on that ring must wake the
parent's reply thread, which sleeps.

Run by tests/pool/test_process_pool_kept_inputs.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, arena_bytes=4 << 20) as pool:
    hoard = pf.hoarder()
    held = tf.data.Dataset.range(5000).map(  # tf.data: the native route, over the rings
        lambda i: pfb.numpy_function(hoard, [tf.reshape(i, [1])], tf.int64, executor=pool),
        num_parallel_calls=2)
    assert max(int(n) for n in held) == 5000
    assert pool.free_input_bytes <= pool.arena_bytes - 5000 * 64
    del hoard, held
    gc.collect()  # the worker forgets the function with the next request
    more = tf.data.Dataset.range(50).map(
        lambda i: pfb.numpy_function(pf.double, [i], tf.int64, executor=pool),
        num_parallel_calls=2)
    assert [int(v) for v in more] == [2 * i for i in range(50)]
    while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
        time.sleep(0.01)
print("done")
