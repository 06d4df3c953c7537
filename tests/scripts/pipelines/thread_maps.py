"""Run by tests/pipelines/test_pipelines.py in a fresh interpreter
(tests/fresh_python.py)."""
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb

def work(x):                       # pure Python that holds the GIL a while
    s = 0
    for i in range(2000):
        s += i ^ int(x)
    return np.int64(s & 0xFFFF)

calls = {
    "numpy_function": lambda x: pfb.numpy_function(work, [x], tf.int64),
    "py_func": lambda x: pfb.py_func(work, [x], tf.int64),
    "array_function": lambda x: pfb.array_function(work, [x], tf.int64, framework="numpy"),
    "py_function": lambda x: pfb.py_function(lambda v: work(v.numpy()), [x], tf.int64),
}
want = sum(int(work(np.int64(i))) for i in range(64))
options = tf.data.Options()
options.threading.private_threadpool_size = 3     # threads that end with each iterator
for name, call in calls.items():
    for npc in (1, 4, tf.data.AUTOTUNE):
        for _ in range(3):
            ds = tf.data.Dataset.range(64).map(call, num_parallel_calls=npc)
            got = sum(int(v) for v in ds.with_options(options))
            assert got == want, (name, npc, got, want)
        print("DONE", name, npc, flush=True)
