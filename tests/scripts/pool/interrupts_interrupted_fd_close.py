"""A Ctrl-C right after close() closed a descriptor, before it noted that: the
close that finishes the interrupted one must not close it again (the number
may be another file's by then), and nothing is left open.

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, sys
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import memfds_of
real_close = os.close
for where in ("doorbell", "_input_fd"):  # (the attributes close_fd closes)
    name = f"interrupted in {where}"
    pool = pfb.ProcessPool(1, name=name)
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
    armed = [True]

    def close(fd):
        real_close(fd)
        caller = sys._getframe(1)
        if armed[0] and caller.f_code.co_name == "close_fd" and caller.f_locals["name"] == where:
            armed[0] = False
            raise KeyboardInterrupt

    os.close = close
    try:
        pool.close()
    except KeyboardInterrupt:
        pass
    os.close = real_close
    assert not armed[0], where  # the interrupt came where it was meant to
    pool.close()
    assert memfds_of(name) == ([], []), (where, memfds_of(name))
print("done")
