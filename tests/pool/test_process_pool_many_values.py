"""A pool call takes as many inputs and outputs as an in-process call
(issue 41): a CALL or DONE whose records do not fit a worker's ring
(pfb_pool_message_fits: 256 slots, a header and a record per value of up to
4 dimensions) travels by the worker's socket instead, packed or as a socket
answer, eagerly, in a graph, in tf.data and under XLA; the values match the
in-process call's, in order."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

# Around the ring's 256 slots (255 records fit with their header), past it,
# and past the longest message (1024 slots).
COUNTS = [255, 256, 300, 1000, 1100]
MODES = ["eager", "graph", "data", "xla"]
WIDTH = 2  # each value is a vector of WIDTH float32
POOL_NAME = "many values pool"


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name=POOL_NAME) as shared:
        yield shared


def run(mode, call, args):
    """`call(*args)` made `mode`'s way, its outputs stacked: a NumPy array
    (for "data", one per element of a two-element dataset of args + 0 and
    args + 1).  The args are the traced function's own: under XLA an input
    sliced out of one tensor costs a compile of seconds per hundred."""
    def stacked(*xs):
        out = call(*xs)
        return tf.stack(out) if isinstance(out, (list, tuple)) else out

    if mode == "eager":
        return stacked(*args).numpy()
    if mode in ("graph", "xla"):
        with tf.device("/CPU:0"):
            return tf.function(stacked, jit_compile=mode == "xla")(*args).numpy()
    elements = tuple(tf.stack([a, a + 1]) for a in args)
    return np.stack([e.numpy() for e in tf.data.Dataset.from_tensor_slices(elements).map(stacked)])


def spec(shape=(WIDTH,)):
    return tf.TensorSpec(shape, tf.float32)


def vectors(count):
    return tf.unstack(tf.reshape(tf.range(count * WIDTH, dtype=tf.float32), [count, WIDTH]))


def many_outputs(count, executor):
    """(a call of `count` outputs, its args), for run."""
    def outputs(x):
        return [x + np.float32(i) for i in range(count)]
    return (lambda x: pfb.numpy_function(outputs, [x], [spec()] * count, executor=executor),
            vectors(1))


def many_inputs(count, executor):
    """(a call of `count` inputs, its args), for run."""
    def joined(*xs):
        return np.stack(xs)  # every input, in order
    return (lambda *xs: pfb.numpy_function(joined, xs, spec((count, WIDTH)), executor=executor),
            vectors(count))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("many", [many_outputs, many_inputs], ids=["outputs", "inputs"])
def test_many_values_match_in_process(pool, many, count, mode):
    in_process = run(mode, *many(count, None))
    in_pool = run(mode, *many(count, pool))
    assert in_pool.shape[-2:] == (count, WIDTH)
    np.testing.assert_array_equal(in_pool, in_process)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_records_are_counted_in_slots_not_values(pool, mode):
    """128 values of rank 5 take two slots each: 257 slots, past the ring
    though fewer values than it has slots, both ways."""
    shape = (1, 1, 1, 1, WIDTH)
    args = [tf.fill(shape, float(i)) for i in range(128)]

    def identity(*xs):
        return list(xs)

    def call(executor):
        return lambda *xs: pfb.numpy_function(identity, xs, [spec(shape)] * 128,
                                              executor=executor)

    np.testing.assert_array_equal(run(mode, call(pool), args), run(mode, call(None), args))


def test_the_pool_keeps_its_worker(pool):
    """The worker that answered by its socket still serves: no replacement."""
    run("eager", *many_outputs(300, pool))
    run("eager", *many_inputs(300, pool))
    assert pfb.stats().pools[POOL_NAME].workers_replaced == 0
