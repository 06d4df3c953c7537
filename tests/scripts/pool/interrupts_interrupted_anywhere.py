"""Ctrl-C at any moment of a call: while its inputs are placed, handed to a
worker, its reply decoded.  Every block must end with an owner: once the
calls are done, the arena is whole and the values right.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import Interrupts, settled
with pfb.ProcessPool(2, arena_bytes=1 << 20, name="interrupted pool") as pool:
    x = tf.fill([64 << 10], 3.0)  # 256 KiB: four fit the arena
    interrupts = Interrupts(seed=18)
    interrupted = calls = 0
    while calls < 300:
        try:
            calls += 1
            out = interrupts.during(pfb.numpy_function, pf.briefly_double_in_place,
                                    [x, x][:1 + calls % 2], tf.float32, copy=True, executor=pool)
            assert float(out[0]) == 6.0 * (1 + calls % 2), (calls, out)
        except KeyboardInterrupt:
            interrupted += 1
    interrupts.stop()
    assert interrupted > 100, interrupted
    settled(pool)  # the state every call leaves in the end, or the script's timeout
    for _ in range(8):
        out = pfb.numpy_function(pf.briefly_double_in_place, [x], tf.float32, copy=True,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.full(64 << 10, 6.0))
print("done")
