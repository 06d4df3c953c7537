"""A fresh interpreter: memory that would leak per call shows in its RSS.

Run by tests/kernel/test_kernel_eager_fast_path.py in a fresh interpreter
(tests/fresh_python.py)."""
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
import pyfunc_bridge as pfb

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

@tf.function
def step(x):
    return pfb.py_function(lambda a: a + 1, [x], tf.float32)

x = tf.zeros([1 << 21])  # 8 MiB: each call makes a fresh 8 MiB result
for _ in range(20):
    step(x)
before = rss()
for _ in range(300):  # 2.4 GiB if results or inputs leaked
    y = step(x)
    del y
print((rss() - before) >> 20)
