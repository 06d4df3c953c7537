"""The kernel through its ops: lifetimes. A zero-copy output keeps its
array alive exactly as long as its tensor, inputs stashed past a call stay
valid, calls leak nothing, containers of outputs are judged as a whole, and
the interpreter exits cleanly with outputs alive and a pipeline running."""
import sys
import weakref

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import address, collect
from fresh_python import fresh_python


class Tracked(np.ndarray):
    """An ndarray subclass that records its own deallocation."""

    deaths = []

    def __del__(self):
        Tracked.deaths.append(self.__array_interface__["data"][0])


def test_zero_copy_output_keeps_its_array_alive_until_the_tensor_dies():
    seen = []

    def func():
        out = np.arange(64, dtype=np.float32).view(Tracked)
        seen.append(address(out))
        return out

    Tracked.deaths.clear()
    y = pfb.numpy_function(func, [], tf.float32)
    collect()
    assert address(y) == seen[0]
    assert seen[0] not in Tracked.deaths
    del y
    collect()
    assert seen[0] in Tracked.deaths


def test_weakly_referenced_output_is_copied():
    refs = []

    def func(a):
        out = a * 2
        refs.append(weakref.ref(out))  # could hand the array out again later
        return out

    y = pfb.numpy_function(func, [tf.constant([1.0, 2.0])], tf.float32)
    collect()
    assert refs[0]() is None  # the bridge kept a copy, not the original
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])


def test_array_returned_twice_is_zero_copy_for_both_outputs():
    seen = []

    def func():
        a = np.arange(4, dtype=np.int32)
        seen.append(address(a))
        return a, a

    y0, y1 = pfb.numpy_function(func, [], [tf.int32, tf.int32], copy=False)
    assert address(y0) == address(y1) == seen[0]


def test_big_endian_output_names_the_byte_order():
    with pytest.raises(tf.errors.InvalidArgumentError, match="byte order '>f4'"):
        pfb.numpy_function(lambda: np.ones(2, ">f4"), [], tf.float32)


def test_stashed_input_view_stays_valid_after_the_tensor_is_gone():
    stash = []
    x = tf.constant(np.arange(1000, dtype=np.int64))
    pfb.numpy_function(lambda a: stash.append(a) or a[:1].copy(), [x], tf.int64)
    del x
    collect()
    np.testing.assert_array_equal(stash[0], np.arange(1000))
    stash.clear()
    collect()


def test_calls_do_not_leak_references_to_the_function():
    def func(a):
        return a + 1

    x = tf.constant([1.0])
    pfb.numpy_function(func, [x], tf.float32)
    collect()
    before = sys.getrefcount(func)
    for _ in range(100):
        pfb.numpy_function(func, [x], tf.float32)
    collect()
    assert sys.getrefcount(func) == before


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


@pytest.mark.slow
def test_one_mib_in_and_out_keeps_memory_flat():
    x = tf.constant(np.ones(2 ** 18, np.float32))  # 1 MiB

    @tf.function
    def loop(x):
        for _ in tf.range(200):
            x = pfb.numpy_function(lambda a: a + 1, [x], tf.float32)
            x.set_shape([2 ** 18])
        return x

    loop(x)
    for _ in range(200):
        pfb.numpy_function(lambda a: a * 1, [x], tf.float32)
    collect()
    start = _rss_mb()
    for _ in range(5):
        loop(x)
    for _ in range(1000):
        pfb.numpy_function(lambda a: a * 1, [x], tf.float32)
    collect()
    assert _rss_mb() - start < 50


# --------------------------------------------------------------- shutdown --

SHUTDOWN_SCRIPT = "kernel/lifetimes_shutdown.py"


def test_interpreter_exit_with_live_outputs_and_running_pipeline_is_clean():
    proc = fresh_python(SHUTDOWN_SCRIPT, timeout=120)
    assert proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Fatal Python error" not in proc.stderr


# ------------------------------------------------- multi-output containers --

@pytest.mark.parametrize("container", [list, tuple])
def test_fresh_arrays_in_a_fresh_container_are_zero_copy(container):
    seen = []

    def func():
        outs = container([np.arange(4, dtype=np.int64), np.ones(3, np.float32)])
        seen.extend(address(o) for o in outs)
        return outs

    y0, y1 = pfb.numpy_function(func, [], [tf.int64, tf.float32])
    assert [address(y0), address(y1)] == seen


SHARED_RESULT = (np.arange(4, dtype=np.int64),)


def test_arrays_in_a_container_someone_else_holds_are_copied():
    y = pfb.numpy_function(lambda: SHARED_RESULT, [], [tf.int64])  # eagerly a tensor, as TF's
    assert not np.shares_memory(np.asarray(y), SHARED_RESULT[0])
    SHARED_RESULT[0][:] = -1
    np.testing.assert_array_equal(y.numpy(), [0, 1, 2, 3])


ATEXIT_SCRIPT = "kernel/lifetimes_atexit.py"


def test_atexit_hooks_registered_after_import_can_use_the_bridge():
    proc = fresh_python(ATEXIT_SCRIPT, timeout=120)
    assert proc.stdout.split() == ["main", "2.0", "atexit", "2.0"], proc.stderr[-2000:]
    assert proc.returncode == 0
