"""A Ctrl-C from outside (the test's SIGINT, once the one worker is inside
a 600 s call): the caller's KeyboardInterrupt abandons the call, and its
worker, which ran it, is ended and replaced, so that the next call is served
now, not once the function returns (then the test's timeout fails it).

Run by tests/pool/test_process_pool_interrupts.py, which sends the SIGINT
once the worker marks the call's start (PFB_TEST_MARKS)."""
import os
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import worker_alive
with pfb.ProcessPool(1, name="abandoning pool") as pool:
    try:
        pfb.numpy_function(pf.hang, [tf.constant(600.0)], tf.int64, executor=pool)
        raise AssertionError("not interrupted")
    except KeyboardInterrupt:
        pass
    (hung,) = os.listdir(os.environ["PFB_TEST_MARKS"])
    for value in (1.0, 2.0):
        out = pfb.numpy_function(pf.plus_one, [tf.constant(value)], tf.float32,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), value + 1)
    # Served by the replacement: the worker that ran the abandoned call is gone.
    assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)) != int(hung)
    assert not worker_alive(int(hung))
print("done")
