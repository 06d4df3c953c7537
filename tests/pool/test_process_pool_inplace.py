"""Process workers: a function that writes its inputs in place runs in a
pool as in-process (the input policy, docs/design.md "Inputs: the input
policy"): a worker's inputs are the call's own copies, writable unless
copy=False, and no write reaches the caller's tensors."""
import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from process_pool_helpers import apply_function
from process_pool_helpers import pool  # noqa: F401 (fixtures)

VALUES = np.array([[3.0, 5.0], [7.0, 9.0]], np.float32)
EXPECTED = (VALUES - 1.0) / 2.0
FUNCS = {"numpy": pf.normalize_in_place, "torch": pf.torch_normalize_in_place}


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_in_place_writes_work_and_stay_in_the_call(pool, framework):
    c = tf.constant(VALUES)
    func = FUNCS[framework]
    call = lambda x: apply_function(func, [x], tf.float32, framework, pool)  # noqa: E731
    graph = tf.function(call)
    captured = tf.function(lambda: call(c))
    data = tf.data.Dataset.from_tensors(c).repeat(3).map(call)
    for _ in range(2):
        np.testing.assert_array_equal(call(c).numpy(), EXPECTED)
        np.testing.assert_array_equal(graph(c).numpy(), EXPECTED)
        np.testing.assert_array_equal(graph(c * 1.0).numpy(), EXPECTED)
        np.testing.assert_array_equal(captured().numpy(), EXPECTED)
        np.testing.assert_array_equal(np.stack(list(data.as_numpy_iterator())),
                                      np.stack([EXPECTED] * 3))
    np.testing.assert_array_equal(c.numpy(), VALUES)


def test_copy_false_keeps_read_only_inputs_in_a_pool(pool):
    f = tf.function(lambda x: apply_function(pf.normalize_in_place, [x], tf.float32, "numpy",
                                             pool, copy=False))
    with pytest.raises(tf.errors.OpError, match="read-only"):
        f(tf.constant(VALUES))
