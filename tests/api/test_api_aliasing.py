"""Results in containers that lie: the copy decision is made from the objects
actually converted, never from what a list or tuple claims to hold."""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import address

with pfb._library.conversion().aligned_allocation():
    # 64-byte aligned: only the aliasing rule can make the bridge copy it.
    GLOBAL = np.arange(16, dtype=np.float32)
EXPECTED = np.arange(16, dtype=np.float32)


class IterYieldsTheGlobal(list):
    def __iter__(self):
        return iter([GLOBAL])


class TupleIterYieldsTheGlobal(tuple):
    def __iter__(self):
        return iter([GLOBAL])


class LenLies(list):
    def __len__(self):
        return 1


def lying_list():
    return IterYieldsTheGlobal([np.zeros(16, np.float32)])


def lying_tuple():
    return TupleIterYieldsTheGlobal((np.zeros(16, np.float32),))


def global_twice():
    return [GLOBAL, GLOBAL]


def run(func, n, mode):
    def call():
        return pfb.numpy_function(func, [], [tf.float32] * n)
    got = (tf.function(call) if mode == "graph" else call)()
    return got if isinstance(got, list) else [got]  # eagerly one is a tensor, as TF's


@pytest.fixture(autouse=True)
def restore_global():
    yield
    GLOBAL[:] = EXPECTED


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("func, n", [(lying_list, 1), (lying_tuple, 1), (global_twice, 2)],
                         ids=["list-iter", "tuple-iter", "global-twice"])
def test_a_global_reached_through_a_container_is_copied(func, n, mode):
    outputs = run(func, n, mode)
    for y in outputs:
        assert address(y) != address(GLOBAL)
    GLOBAL[:] = -1
    for y in outputs:
        np.testing.assert_array_equal(y.numpy(), EXPECTED)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_global_from_a_lying_container_is_refused_under_copy_false(mode):
    def call():
        return pfb.numpy_function(lying_list, [], [tf.float32], copy=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="still reachable"):
        (tf.function(call) if mode == "graph" else call)()


def test_what_iteration_yields_is_converted_as_tensorflow_does():
    ours = pfb.numpy_function(lying_list, [], tf.float32)
    theirs = tf.numpy_function(lying_list, [], tf.float32)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(ours.numpy(), EXPECTED)


def test_a_len_that_lies_does_not_decide_the_output_count():
    def func():
        return LenLies([np.zeros(2, np.float32), np.ones(2, np.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="returned 2 value"):
        pfb.numpy_function(func, [], [tf.float32])


def test_fresh_arrays_in_a_lying_container_are_still_zero_copy():
    made = []

    class Yields(list):
        def __iter__(self):
            return iter(list.__iter__(self))

    def func():
        out = Yields([np.ones(16, np.float32), np.zeros(16, np.float32)])
        made.extend(address(a) for a in out)
        return out

    y0, y1 = pfb.numpy_function(func, [], [tf.float32, tf.float32])
    assert [address(y0), address(y1)] == made


def test_a_global_torch_tensor_reached_through_a_lying_list_is_copied(torch):
    with pfb._library.conversion().aligned_allocation():
        backing = np.arange(16, dtype=np.float32)
    shared = torch.from_numpy(backing)

    class Lying(list):
        def __iter__(self):
            return iter([shared])

    (y,) = pfb.array_function(lambda: Lying([torch.zeros(16)]), [], [tf.float32],
                              framework="torch")
    assert address(y) != shared.data_ptr()
    shared[:] = -1
    np.testing.assert_array_equal(y.numpy(), EXPECTED)
