"""A graph's or tf.data's pool call holds no TensorFlow thread while a worker
runs it (issue 44, item 5; docs/pool.md, "A kernel's native call"): the
kernel posts the call and returns its thread, and the reply completes the op.

Written against the public API (`executor=`, tf.data's options): the sign
is concurrency in the workers that one TF thread could not give, read from
the calls' own start and end marks (process_functions.logged_sleep)."""
import os

import tensorflow as tf

from process_pool_helpers import run_script

# A map on one private TF thread, 8 calls at a time, over 4 workers: each
# worker leaves the start and end of its calls in argv[1].  Blocking calls
# run one at a time (the one thread waits in each); posted ones, 4.
MAP_ON_ONE_THREAD = """
import sys
import time
import tensorflow as tf
import process_functions as pf
import pyfunc_bridge as pfb
folder, elements, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with pfb.ProcessPool(4) as pool:
    # (Elements 0 and 1 answer at once: the kernel's first calls on a TF
    # thread take the Python path, the second offering the route; the first
    # elements, which a test takes.)
    dataset = tf.data.Dataset.range(elements).map(
        lambda i: pfb.numpy_function(
            pf.logged_sleep, [i, tf.where(i < 2, 0.0, seconds), folder], tf.int64,
            executor=pool),
        num_parallel_calls=8)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    dataset = dataset.with_options(options)
    mode = sys.argv[4]
    if mode == "all":
        assert sorted(int(v) for v in dataset) == list(range(elements))
    else:  # take the first element, then drop the iterator while calls run
        iterator = iter(dataset)
        assert [int(next(iterator)) for _ in range(2)] == [0, 1]
        while len([n for n in os.listdir(folder) if n.endswith(".start")]) < 3:
            time.sleep(0.01)  # a call of 2 to 7 runs in a worker
        del iterator
        # Cancelled: dropped without waiting for the calls in the workers.
        ended = sorted(n for n in os.listdir(folder) if n.endswith(".end"))
        assert ended == ["0.end", "1.end"], ended
        # The pool serves on (its workers finish the abandoned calls first).
        out = pfb.numpy_function(pf.plus_one, [tf.constant(41)], tf.int32, executor=pool)
        assert int(out) == 42
print("done")
"""


def _most_at_once(folder):
    """The most calls that ran at the same moment, by their marks."""
    events = []
    for name in os.listdir(folder):
        if name.endswith(".start"):
            index = name[:-len(".start")]
            with open(os.path.join(folder, name)) as f:
                start = float(f.read())
            with open(os.path.join(folder, index + ".end")) as f:
                end = float(f.read())
            events += [(start, 1), (end, -1)]
    running = most = 0
    for _, step in sorted(events):
        running += step
        most = max(most, running)
    return most


def test_a_map_on_one_tf_thread_keeps_every_worker_busy(tmp_path):
    run_script("import os\n" + MAP_ON_ONE_THREAD, str(tmp_path), "16", "0.25", "all")
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".end")]) == 16
    # The kernel's first calls on the thread take the Python path (the
    # second offers the route); the rest are posted, 4 at a time at least
    # once.
    assert _most_at_once(tmp_path) >= 3, _most_at_once(tmp_path)


def test_dropping_an_iterator_cancels_its_calls_in_flight(tmp_path):
    # Elements 0 and 1 at once, then 6 calls of 5 s: the iterator goes as
    # soon as one of them started (blocking calls kept it until they ended).
    run_script("import os\n" + MAP_ON_ONE_THREAD, str(tmp_path), "8", "5", "first")
