"""A worker's result arena (the compiled module's NumPy handler, used by
pyfunc_bridge/worker/): a fresh result the function computed is sent by
its offset without a copy; a result the worker could still change is copied;
workers load their compiled module without TensorFlow."""
import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import in_arena
import pyfunc_bridge as pfb

LARGE = 1 << 16  # float32 elements: 256 KiB, above the worker's 64 KiB threshold


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name="arena test pool") as one:
        yield one


def test_a_fresh_result_comes_back_without_a_copy(pool, stats_on):
    x = tf.random.uniform([LARGE])
    y = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool, name="fresh result")
    np.testing.assert_array_equal(y.numpy(), x.numpy() * 2)
    assert in_arena(pool, y)
    entry = pfb.stats().functions["fresh result"]
    assert entry.bytes_copied["worker"] == 4 * LARGE  # the input's copy only
    assert entry.bytes_zero_copy == 4 * LARGE


def test_a_small_result_is_copied(pool, stats_on):
    y = pfb.numpy_function(pf.double, [tf.ones([1024])], tf.float32, executor=pool,
                           name="small result")
    assert in_arena(pool, y) and (y.numpy() == 2).all()
    assert pfb.stats().functions["small result"].bytes_copied["worker"] == 2 * 4096


def test_a_result_the_worker_keeps_is_copied(pool):
    x = tf.fill([LARGE], 3.0)
    first = pfb.numpy_function(pf.keeps_its_result, [x], tf.float32, executor=pool)
    second = pfb.numpy_function(pf.keeps_its_result, [x], tf.float32, executor=pool)
    # The worker overwrote the array it kept after the first call: the first
    # output is a copy, so it still holds the first call's values.
    assert (first.numpy() == 6).all() and (second.numpy() == 6).all()
    assert in_arena(pool, first) and in_arena(pool, second)


def test_copy_false_accepts_a_fresh_result_sent_without_a_copy(pool, stats_on):
    """The copy facts of a result the arena hands over as it is are those of
    what the function returned: a fresh compact array, which copy=False
    accepts (and no copy is made anywhere on the way back)."""
    x = tf.random.uniform([LARGE])
    y = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool, copy=False,
                           name="fresh result, copy=False")
    np.testing.assert_array_equal(y.numpy(), x.numpy() * 2)
    assert in_arena(pool, y)
    assert pfb.stats().functions["fresh result, copy=False"].bytes_copied["worker"] == 4 * LARGE


def test_copy_false_refuses_a_large_result_the_worker_keeps(pool):
    """A large array the function keeps is copied into the arena, and
    copy=False still refuses it, as in-process: the facts are taken from
    what the function returned (before the worker takes a reference), not
    from the copy."""
    x = tf.fill([LARGE], 3.0)

    def outcome(executor):
        pf._kept_results.clear()
        try:
            return "ok", pfb.numpy_function(pf.keeps_its_result, [x], tf.float32,
                                            executor=executor, copy=False).numpy().sum()
        except tf.errors.InvalidArgumentError as exc:
            return type(exc), exc.message

    expected = outcome(None)
    assert expected[0] is tf.errors.InvalidArgumentError
    assert outcome(pool) == expected


def test_result_blocks_go_back_when_the_outputs_go():
    """Without gc.collect: a block goes back when its output's last reference does."""
    x = tf.random.uniform([LARGE])
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="small arena pool") as small:
        for _ in range(3 * (1 << 20) // (4 * LARGE)):  # three times the arena's room
            y = pfb.numpy_function(pf.double, [x], tf.float32, executor=small)
            assert in_arena(small, y)  # blocks that never came back: pickled results
            np.testing.assert_array_equal(y.numpy(), x.numpy() * 2)
            del y


def test_workers_load_their_module_without_tensorflow(pool):
    loaded = pfb.numpy_function(pf.worker_modules, [tf.constant(0)], tf.bool, executor=pool)
    assert loaded.numpy().tolist() == [False, True]


def test_a_result_that_fails_gives_back_the_blocks_of_the_items_before_it():
    x = tf.random.uniform([LARGE])
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="small arena pool") as small:
        for _ in range(3 * (1 << 20) // (4 * LARGE)):  # three times the arena's room
            with pytest.raises(tf.errors.UnknownError, match="cannot become an array"):
                pfb.numpy_function(pf.fresh_then_failing, [x], [tf.float32, tf.float32],
                                   executor=small)
        y = pfb.numpy_function(pf.double, [x], tf.float32, executor=small)
        assert in_arena(small, y)  # leaked blocks would have filled the arena
