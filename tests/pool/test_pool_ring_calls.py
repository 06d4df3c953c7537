"""Pool calls that the rings carry whole (issue 28, "one transport"): torch
and JAX array_function calls (the framework travels in the CALL) and
copy=False calls (the worker's copy facts travel in the DONE's records:
src/pool/shm_layout.h, PFB_POOL_CALL_* and PFB_POOL_TENSOR_*).

Written against the public API: a call that needs no Python in this process
keeps completing while a thread holds the GIL (the proof of
tests/pool/test_pool_native_gil.py), and what the pool answers is what in-process pfb answers, values
and error texts alike, whichever path a call took.  A map's first calls take
the Python path; the gated functions below change what they return after
GATE elements, so that the later, native calls are the ones judged.
"""
import time

import numpy as np
import pytest
import tensorflow as tf

import copy_functions as cf
import process_functions as pf
import pyfunc_bridge as pfb
from test_pool_native_gil import (STAMP_SECONDS, THRESHOLD,
                                  ended_while_the_gil_is_held)

POOL_NAME = "ring calls pool"
GATE = 12  # elements answered alike before a gated function changes
N = 40


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(2, name=POOL_NAME) as shared:
        yield shared


def torch_stamp(_):
    """test_pool_native_gil's stamp, as a torch tensor."""
    import torch
    time.sleep(STAMP_SECONDS)
    return torch.tensor(time.time_ns(), dtype=torch.int64)


def fresh_double(x):
    return x * 2  # NumPy or torch: a fresh compact result


def apply(func, inputs, tout, framework, executor, copy=None):
    if framework == "numpy":
        return pfb.numpy_function(func, inputs, tout, executor=executor, copy=copy)
    return pfb.array_function(func, inputs, tout, framework=framework, executor=executor,
                              copy=copy)


def gated(before, after):
    """`before(x)` for the first GATE elements, then `after(x)`."""
    return lambda x, i: before(x) if int(i) < GATE else after(x)


def map_outcome(func, tout, framework, executor, copy, n=N, make=None):
    """The values of a parallel deterministic map of `func(x, i)` up to its
    first error, and that error's class and text."""
    make = make or (lambda i: tf.reshape(tf.range(12.0), [3, 4]) + tf.cast(i, tf.float32))
    dataset = tf.data.Dataset.range(n).map(
        lambda i: apply(func, [make(i), tf.cast(i, tf.int32)], tout, framework, executor,
                        copy),  # (int32: JAX without x64 refuses 64-bit inputs)
        num_parallel_calls=4, deterministic=True)
    values = []
    try:
        for out in dataset:
            values.append([o.numpy().tolist() for o in (out if isinstance(out, tuple)
                                                        else [out])])
    except tf.errors.OpError as exc:
        # The text tf.data puts first names the dataset, whose number
        # differs; a worker's error ends with its traceback there.
        text = exc.message.split("Iterator::Root::ParallelMapV2: ")[-1]
        return values, (type(exc), text.split("\n\n")[0])
    return values, None


def result_ranges(name):
    """The address ranges of `name`'s result arenas mapped in this process."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if f"/memfd:{name}-results" in line:
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


# ----------------------------------------------------- without the GIL --

def test_torch_calls_keep_completing_while_a_thread_holds_the_gil(pool, torch):
    during = ended_while_the_gil_is_held(
        lambda i: pfb.array_function(torch_stamp, [i], tf.int64, framework="torch",
                                     executor=pool))
    assert during >= THRESHOLD, (
        f"only {during} torch pool calls ended while a thread held the GIL for 1 s: "
        f"array_function's calls take the Python path")


def test_copy_false_calls_keep_completing_while_a_thread_holds_the_gil(pool):
    from test_pool_native_gil import stamp
    during = ended_while_the_gil_is_held(
        lambda i: pfb.numpy_function(stamp, [i], tf.int64, executor=pool, copy=False))
    assert during >= THRESHOLD, (
        f"only {during} copy=False pool calls ended while a thread held the GIL for 1 s: "
        f"copy=False calls take the Python path")


# ------------------------------------------------------------- values --

@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_framework_map_answers_as_in_process(pool, framework):
    pytest.importorskip(framework)
    got = map_outcome(lambda x, i: fresh_double(x), tf.float32, framework, pool, None)
    assert got == map_outcome(lambda x, i: fresh_double(x), tf.float32, framework, None, None)
    assert got[1] is None and len(got[0]) == N


def test_a_torch_write_to_an_input_fails_a_native_copy_false_call_as_in_process(pool, torch):
    func = gated(fresh_double, pf.briefly_double_in_place)
    got = map_outcome(func, tf.float32, "torch", pool, False)
    assert got == map_outcome(func, tf.float32, "torch", None, False)
    assert len(got[0]) == GATE and "wrote to input 0 in place" in got[1][1]
    # copy=None and copy=True give the function inputs it may write, on the ring too.
    for copy in (None, True):
        got = map_outcome(func, tf.float32, "torch", pool, copy)
        assert got == map_outcome(func, tf.float32, "torch", None, copy) and got[1] is None


# ---------------------------------------------------------- copy=False --

F32, C64 = tf.float32, tf.complex64


def torch_fresh_complex(x):
    import torch
    return torch.ones(3, dtype=torch.complex64)


@pytest.mark.parametrize("before, after, framework, tout, refused", [
    (cf.fresh, cf.fresh, "numpy", F32, None),
    (cf.fresh, cf.input_itself, "numpy", F32, None),
    (cf.fresh, cf.strided, "numpy", F32, "non_contiguous"),
    (cf.fresh, cf.transposed, "numpy", F32, "non_contiguous"),
    (cf.fresh, cf.unaligned, "numpy", F32, "unaligned"),
    (cf.fresh, cf.input_rows, "numpy", F32, "non_contiguous"),
    (cf.fresh, cf.shared_array, "numpy", F32, "aliasing"),
    (cf.fresh, cf.view_of_shared, "numpy", F32, "aliasing"),
    (cf.fresh, cf.strided_of_another_dtype, "numpy", F32, "dtype"),
    (cf.torch_fresh, cf.torch_fresh, "torch", F32, None),
    (cf.torch_fresh, cf.input_itself, "torch", F32, None),
    (cf.torch_fresh, cf.torch_transposed, "torch", F32, "non_contiguous"),
    (cf.torch_fresh, cf.torch_input_rows, "torch", F32, "non_contiguous"),
    (cf.torch_fresh, cf.torch_view_of_fresh, "torch", F32, "aliasing"),
    (cf.torch_fresh, cf.torch_as_numpy, "torch", F32, "aliasing"),
    (torch_fresh_complex, cf.torch_conjugate, "torch", C64, "lazy"),
], ids=lambda v: getattr(v, "__name__", None))
def test_copy_false_judges_native_calls_as_in_process(pool, before, after, framework, tout,
                                                      refused):
    """The calls after the gate run natively: their refusal (or not) is
    in-process pfb's, with its error class and text."""
    if framework != "numpy":
        pytest.importorskip(framework)
    func = gated(before, after)
    got = map_outcome(func, tout, framework, pool, False)
    assert got == map_outcome(func, tout, framework, None, False)
    if refused is None:
        assert got[1] is None and len(got[0]) == N
    else:
        assert len(got[0]) == GATE, got
        if refused != "dtype":
            assert "copy=False forbids copies" in got[1][1]


def test_copy_false_shares_accepted_results_without_a_copy(pool, stats_on):
    """A result copy=False accepts is handed over in the worker's memory:
    every output of the map views one of the pool's result arenas."""
    dataset = tf.data.Dataset.range(N).map(
        lambda i: pfb.numpy_function(fresh_double, [tf.fill([1 << 14], i)], tf.int64,
                                     executor=pool, copy=False, name="copy_false_shared"),
        num_parallel_calls=4, deterministic=True)
    outs = list(dataset)
    ranges = result_ranges(POOL_NAME)
    for i, out in enumerate(outs):
        address = pfb.to_numpy(out).ctypes.data
        assert any(lo <= address < hi for lo, hi in ranges), i
        np.testing.assert_array_equal(out.numpy(), np.full(1 << 14, 2 * i))
    entry = pfb.stats().functions["copy_false_shared"]
    assert entry.calls == N and entry.bytes_zero_copy == N * 8 << 14


@pytest.mark.parametrize("after, refused", [(cf.large_fresh, False),
                                            (cf.large_transposed, True)])
def test_copy_false_judges_answers_too_large_for_the_arena(after, refused):
    """An answer that does not fit the result arena goes by the socket with
    its copy facts: judged as in-process."""
    func = gated(cf.large_fresh, after)
    with pfb.ProcessPool(1, arena_bytes=4096, name="small ring copy pool") as small:
        got = map_outcome(func, tf.float32, "numpy", small, False, n=2 * GATE)
    assert got == map_outcome(func, tf.float32, "numpy", None, False, n=2 * GATE)
    assert (got[1] is not None) == refused
