"""Inputs the input arena has no room for, those the ring's records cannot
describe, and the argument list of a call with more inputs than its ring
holds, travel on the worker's socket, pulled by the worker by payload id
(src/pool/shm_layout.h, PFB_POOL_TENSOR_SOCKET, PFB_POOL_CALL_PACKED): the
call itself still goes over the rings, the only way a call goes."""

import sys

import numpy as np
import pytest
import tensorflow as tf

import process_functions as pf
from conftest import input_arena_whole, wait_for
from fresh_python import fresh_python
import pyfunc_bridge as pfb

BIG = 16 << 10  # float32 elements: 64 KiB, sixteen times a 4 KiB arena


@pytest.fixture
def small():
    with pfb.ProcessPool(1, arena_bytes=4096, name="pulled inputs pool") as pool:
        yield pool


def test_an_input_larger_than_the_arena_is_pulled(small):
    x = np.arange(BIG, dtype=np.float32)
    got = pfb.numpy_function(pf.double, [tf.constant(x)], tf.float32, executor=small)
    np.testing.assert_array_equal(got.numpy(), x * 2)

    @tf.function
    def graph(t):  # a kernel's first call, then its native calls declined for room
        return pfb.numpy_function(pf.double, [t], tf.float32, executor=small)
    for _ in range(3):
        np.testing.assert_array_equal(graph(tf.constant(x)).numpy(), x * 2)
    # Only the one that fits goes in a block; the other is pulled.
    np.testing.assert_array_equal(
        pfb.numpy_function(pf.add, [tf.constant(x), tf.ones([4], tf.float32)[:1]],
                           tf.float32, executor=small).numpy(), x + 1)
    input_arena_whole(small)


@pytest.mark.parametrize("copy", [None, True])
def test_pulled_inputs_are_writable_unless_copy_false(small, copy):
    x = tf.constant(np.ones(BIG, np.float32))
    assert not pfb.numpy_function(pf.is_writable, [x], tf.bool, copy=False,
                                  executor=small).numpy()
    assert pfb.numpy_function(pf.is_writable, [x], tf.bool, copy=copy,
                              executor=small).numpy()
    got = pfb.numpy_function(pf.briefly_double_in_place, [x], tf.float32, copy=copy,
                             executor=small)
    np.testing.assert_array_equal(got.numpy(), np.full(BIG, 2.0, np.float32))
    np.testing.assert_array_equal(x.numpy(), np.ones(BIG, np.float32))  # the caller's stays


@pytest.mark.parametrize("func", [pf.identity, pf.keeps_and_returns_its_input])
def test_copy_false_returns_a_pulled_input_as_in_process(small, func):
    """A function that returns (and keeps) its input under copy=False needs
    no copy in-process (TensorFlow's read-only memory): a pulled input is
    the call's input memory too, as a block is, so the pool takes it alike."""
    for n in (BIG, 3 * BIG + 1):  # (each larger than the whole arena: pulled)
        x = np.arange(n, dtype=np.float32)
        for executor in (None, small):
            got = pfb.numpy_function(func, [tf.constant(x)], tf.float32, copy=False,
                                     executor=executor)
            np.testing.assert_array_equal(got.numpy(), x)


def test_pulled_strings(small):
    s = tf.constant([b"x" * 70_000, b"", b"yz"])
    assert pfb.numpy_function(pf.total_length, [s], tf.int64, executor=small).numpy() == 70_002
    one = pfb.numpy_function(pf.upper, [tf.constant(b"ab" * 40_000)], tf.string,
                             executor=small)
    assert one.numpy() == b"AB" * 40_000


def test_pulled_scalars_are_scalars_in_graphs(small):
    keep = pf.hoarder()
    full = tf.constant(np.zeros(1024, np.float32))  # 4 KiB: the whole arena, kept
    assert pfb.numpy_function(keep, [full], tf.int64, executor=small).numpy() == 1
    assert small.free_input_bytes == 0

    @tf.function
    def graph(v):
        return pfb.numpy_function(pf.short_type_name, [v], tf.string, executor=small)
    # No room at all: the 0-d input is pulled, and is a NumPy scalar in a graph
    # (numpy_function's rule) and a 0-d array eagerly.
    assert graph(tf.constant(2.5)).numpy() == b"float32"
    assert pfb.numpy_function(pf.short_type_name, [tf.constant(2.5)], tf.string,
                              executor=small).numpy() == b"ndarray"
    np.testing.assert_array_equal(
        pfb.numpy_function(pf.plus_one, [tf.constant(3.0)], tf.float32,
                           executor=small).numpy(), 4.0)


def test_kept_inputs_fill_the_arena_and_later_calls_are_pulled(small):
    keep = pf.keeper()
    first = np.arange(1024, dtype=np.float32)  # 4 KiB: the whole arena, kept for good
    np.testing.assert_array_equal(
        pfb.numpy_function(keep, [tf.constant(first)], tf.float32, executor=small).numpy(),
        first)
    assert small.free_input_bytes == 0
    later = np.arange(10, dtype=np.float32)
    for i in range(1, 4):  # each pulled, and kept too
        got = pfb.numpy_function(keep, [tf.constant(later + i)], tf.float32, executor=small)
        np.testing.assert_array_equal(got.numpy()[-10:], later + i)
        assert got.shape == (1024 + 10 * i,)
        np.testing.assert_array_equal(
            pfb.numpy_function(pf.double, [tf.constant(later)], tf.float32,
                               executor=small).numpy(), later * 2)
    assert small.free_input_bytes == 0


def test_the_largest_inputs_are_pulled_until_the_rest_fit_the_room(small):
    """A call the arena has no room for now, with no call in flight (ENOSPC):
    its largest inputs go by the socket until the rest fit the room free
    (input_records.h, pfb_input_transport), whatever their order."""
    keep = pf.keeper()
    pfb.numpy_function(keep, [tf.zeros([512], tf.float32)], tf.float32, executor=small)
    wait_for(lambda: small.free_input_bytes == 2048)  # 2 KiB kept for good
    large, little = tf.zeros([768], tf.float32), tf.ones([256], tf.float32)  # 3 KiB, 1 KiB
    for inputs, blocks in (([large, little], [False, True]), ([little, large], [True, False])):
        got = pfb.numpy_function(pf.over_blocks, inputs, tf.bool, executor=small)
        assert got.numpy().tolist() == blocks


def test_torch_gets_pulled_inputs_as_tensors(torch):
    with pfb.ProcessPool(1, arena_bytes=4096, name="pulled torch pool") as pool:
        x = tf.constant(np.arange(BIG, dtype=np.float32))
        got = pfb.array_function(pf.torch_square, [x], tf.float32, framework="torch",
                                 executor=pool)
        np.testing.assert_array_equal(got.numpy(), x.numpy() ** 2)
        assert pfb.array_function(pf.short_type_name, [x], tf.string, framework="torch",
                                  executor=pool).numpy() == b"Tensor"


def test_a_pool_without_arena_bytes_takes_the_rings():
    with pfb.ProcessPool(1, arena_bytes=0, name="no arena pool") as pool:
        assert pool.arena_bytes == 4096  # one page
        np.testing.assert_array_equal(
            pfb.numpy_function(pf.plus_one, [tf.constant([1, 2])], tf.int32,
                               executor=pool).numpy(), [2, 3])
        x = np.arange(BIG, dtype=np.float32)  # in and out larger than the arenas
        np.testing.assert_array_equal(
            pfb.numpy_function(pf.double, [tf.constant(x)], tf.float32,
                               executor=pool).numpy(), x * 2)
        assert pfb.numpy_function(pf.upper, [tf.constant(b"ab" * 10_000)], tf.string,
                                  executor=pool).numpy() == b"AB" * 10_000
        assert pfb.numpy_function(pf.upper, [tf.constant(b"ab")], tf.string,
                                  executor=pool).numpy() == b"AB"


MANY = 300  # inputs: more records than a worker's ring has slots (256)


def _sum_of_all(*values):
    """The sum of every input (a string counts its length), and the types
    the function got."""
    def measure(v):
        if isinstance(v, bytes):
            return len(v)
        arr = np.asarray(v)
        if arr.dtype.kind in "OSU":
            return sum(len(e) for e in arr.ravel())
        return float(np.sum(arr.astype(np.float64)))
    return (np.float64(sum(measure(v) for v in values)),
            " ".join(sorted({type(v).__name__ for v in values})).encode())


def _many_inputs():
    """MANY inputs of several kinds: 0-d and 1-d numbers, bytes and a large one."""
    inputs = []
    for i in range(MANY):
        kind = i % 4
        inputs.append(tf.constant(float(i)) if kind == 0 else
                      tf.range(i % 7, dtype=tf.int32) if kind == 1 else
                      tf.constant(b"x" * (i % 5)) if kind == 2 else
                      tf.fill([8], tf.cast(i, tf.float16)))
    inputs[7] = tf.ones([BIG])  # larger than the arena of `small`
    return inputs


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_call_with_more_inputs_than_its_ring_holds_runs_as_in_process(small, mode):
    """Its argument list travels packed, pulled as one payload: the values,
    and the types the function gets (NumPy scalars in graphs, 0-d arrays
    eagerly, bytes for strings), are those of the same call in-process."""
    inputs = _many_inputs()

    def call(executor):
        def run(*xs):
            return pfb.numpy_function(_sum_of_all, list(xs), [tf.float64, tf.string],
                                      executor=executor)
        if mode == "graph":
            run = tf.function(run)
        total, types = run(*inputs)
        return float(total), types.numpy()

    expected = call(None)
    assert call(small) == expected
    assert call(small) == expected  # (a graph's later calls: the kernel's native try first)
    input_arena_whole(small)


def test_cupy_has_a_call_flag():
    # CuPy is not installed here: only the route for it is checked.
    with pfb.ProcessPool(1, name="cupy flag pool") as pool:
        assert pool.native_route(pf.double, "cupy", False, False) is not None


def _run(script, *args):
    run = fresh_python(script, *args)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-3000:]


# Ctrl-C at any moment of calls whose inputs are pulled (before, during and
# after the worker asks for them): the pool keeps working, and its arena is
# whole once the calls are done.
_INTERRUPTED_SCRIPT = "pool/socket_inputs_interrupted.py"


def test_ctrl_c_around_pulls_leaves_the_pool_working():
    _run(_INTERRUPTED_SCRIPT)


def _in_ring_call(thread):
    """Whether `thread` waits in a ring call (its innermost Python frame)."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"


# A caller that stops waiting before its worker pulls the input: the worker
# is told the input is gone (its call fails, nobody waits for it), and the
# next calls run.
_GONE_SCRIPT = "pool/socket_inputs_gone.py"


def test_an_input_whose_caller_left_fails_only_its_call(tmp_path):
    _run(_GONE_SCRIPT, str(tmp_path / "go"))


# A worker killed with a call whose input it had not pulled yet behind its
# running one: the running call fails with WorkerError, the other is resent
# and its new worker pulls the input.
_KILLED_SCRIPT = "pool/socket_inputs_killed.py"


def test_a_killed_worker_s_unpulled_call_is_resent(tmp_path):
    _run(_KILLED_SCRIPT, str(tmp_path))
