"""Ctrl-C at any moment of calls whose inputs are pulled (before, during and
after the worker asks for them): the pool keeps working, and its arena is
whole once the calls are done.

Run by tests/pool/test_pool_socket_inputs.py in a fresh interpreter
(tests/fresh_python.py)."""
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import Interrupts, settled
with pfb.ProcessPool(2, arena_bytes=4096, name="interrupted pulls") as pool:
    x = tf.fill([64 << 10], 3.0)  # 256 KiB: always pulled
    interrupts = Interrupts(seed=28)
    interrupted = calls = 0
    while calls < 200:
        try:
            calls += 1
            out = interrupts.during(pfb.numpy_function, pf.briefly_double_in_place,
                                    [x], tf.float32, copy=True, executor=pool)
            assert float(out[0]) == 6.0, (calls, out)
        except KeyboardInterrupt:
            interrupted += 1
    interrupts.stop()
    assert interrupted > 50, interrupted
    settled(pool)
    for _ in range(8):
        out = pfb.numpy_function(pf.briefly_double_in_place, [x], tf.float32, copy=True,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.full(64 << 10, 6.0))
print("done")
