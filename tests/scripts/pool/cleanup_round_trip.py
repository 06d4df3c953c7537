"""Run by tests/pool/test_process_pool_cleanup.py in a fresh interpreter
(tests/fresh_python.py)."""
import os
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))

with pfb.ProcessPool(1, name="round trip pool") as pool:  # 64 MiB arenas: 200 MiB is pickled
    (pid,) = pool.pids()
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=pool)
    x = tf.fill([50 << 20], 1.0)  # 200 MiB
    before = rss_mib(pid), rss_mib(os.getpid())
    for _ in range(2):
        out = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool)
        assert float(out[-1]) == 2.0
        del out
    after = rss_mib(pid), rss_mib(os.getpid())
    # Nothing of 200 MiB frames stays: no buffer, no reply kept.
    assert after[0] < before[0] + 32 and after[1] < before[1] + 64, (before, after)
print("done")
