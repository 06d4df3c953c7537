"""Process workers: a function that keeps its inputs sees them unchanged,
and kept input blocks go back to the arena when the worker lets go of them
(also when it dies); no call waits for room that only a kept block gives."""
import gc
import os
import signal

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
import pyfunc_bridge as pfb
from process_pool_helpers import apply_function, arena_settled, run_script


@pytest.fixture(scope="module")
def single():
    """A one-worker pool: a function that keeps state keeps it in one place."""
    with pfb.ProcessPool(1, name="single pool") as one:
        yield one


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_function_that_keeps_its_inputs_reads_them_unchanged(single, framework):
    """An accumulator: the inputs it keeps are not overwritten by the next
    calls' inputs (their blocks stay the worker's while it views them)."""
    def accumulate(executor):
        keep = pf.keeper()
        return [apply_function(keep, [tf.fill([2], float(i))], tf.float32, framework,
                       executor).numpy().tolist() for i in range(3)]
    expected = accumulate(None)  # in-process: the oracle
    assert expected[-1] == [0, 0, 1, 1, 2, 2]
    assert accumulate(single) == expected


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_deduplicator_flags_exactly_the_repeated_inputs(single, framework):
    values = [0, 1, 2, 3, 4, 0, 1, 2]

    def flags(executor):
        seen = pf.deduplicator()
        return [bool(apply_function(seen, [tf.fill([3], float(v))], tf.bool, framework, executor))
                for v in values]
    expected = flags(None)
    assert expected == [False] * 5 + [True] * 3
    assert flags(single) == expected


def test_a_deduplicating_map_in_a_pool_matches_in_process(single):
    def flags(executor):
        seen = pf.deduplicator()
        dataset = tf.data.Dataset.from_tensor_slices([0, 1, 2, 3, 4, 0, 1, 2]).map(
            lambda v: pfb.numpy_function(seen, [tf.fill([3], v)], tf.bool, executor=executor))
        return [bool(flag) for flag in dataset.as_numpy_iterator()]
    assert flags(single) == flags(None) == [False] * 5 + [True] * 3


def test_kept_input_blocks_go_back_when_the_worker_lets_go_of_them(single):
    gc.collect()  # the functions of the tests before: forgotten with the next message
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=single)
    assert arena_settled(single, single.arena_bytes) == single.arena_bytes
    x = tf.range(1000.0)  # 4000 bytes: one 4032-byte block
    keep = pf.keep_last()
    for _ in range(3):
        assert float(pfb.numpy_function(keep, [x], tf.float32, executor=single)) == 499500.0
    # Each call let go of the input before it; the last one is still held.
    assert arena_settled(single, single.arena_bytes - 4032) == single.arena_bytes - 4032
    del keep
    gc.collect()  # the worker forgets the function with the next message
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=single)
    assert arena_settled(single, single.arena_bytes) == single.arena_bytes


# Wrong values, or a hang (in a subprocess, then), where kept blocks are
# reused or where a call waits for room that only a kept block could give.
_KEPT_FILL_THE_ARENA_SCRIPT = "pool/kept_inputs_kept_fill_the_arena.py"


def test_inputs_kept_by_functions_leave_no_call_waiting_for_room():
    run_script(_KEPT_FILL_THE_ARENA_SCRIPT)


# A hang (in a subprocess, then) where a worker hands back more input
# blocks at once than its reply ring holds: the function that kept 5,000
# inputs is forgotten, and the worker's wait for room on that ring must wake
# the parent's reply thread, which sleeps.
_MANY_INPUTS_BACK_SCRIPT = "pool/kept_inputs_many_inputs_back.py"


def test_a_worker_handing_back_more_inputs_than_its_ring_holds_goes_on():
    run_script(_MANY_INPUTS_BACK_SCRIPT)


def test_a_dead_workers_kept_blocks_go_back_to_the_arena():
    with pfb.ProcessPool(1, name="keeping fault pool") as keeping:
        keep = pf.keeper()
        pfb.numpy_function(keep, [tf.range(100.0)], tf.float32, executor=keeping)
        (victim,) = keeping.pids()
        assert arena_settled(keeping) < keeping.arena_bytes  # the kept block
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: keeping.pids() not in ([], [victim]))  # replaced
        assert arena_settled(keeping, keeping.arena_bytes) == keeping.arena_bytes
