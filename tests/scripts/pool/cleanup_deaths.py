"""With gc off, in a fresh interpreter: what a dead worker leaves must go when
its death is handled, not when a collection finds it.

Run by tests/pool/test_process_pool_cleanup.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, os, signal
gc.disable()
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
import pool_checks as t
from conftest import wait_for
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="dying pool") as pool:
    def call():
        return float(pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32,
                                        executor=pool)[0])
    assert call() == 4.0
    fds, maps = len(t.descriptors("socket:", "/memfd:")), len(t.memfds_of("dying pool")[1])
    for _ in range(10):
        (victim,) = pool.pids()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pool.pids() not in ([], [victim]))  # replaced
        assert call() == 4.0  # (waits for the new worker to be ready)
    wait_for(lambda: len(t.descriptors("socket:", "/memfd:")) == fds)
    assert len(t.memfds_of("dying pool")[1]) == maps, (t.memfds_of("dying pool")[1], maps)
print("done")
