"""Runtime statistics: pfb.stats(), reset_stats(), enable_stats().

Counts and byte categories are exact for known inputs and outputs.
"""
import dataclasses
import re
import time

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from fresh_python import fresh_python

REASONS = {"unaligned", "non_contiguous", "aliasing", "dtype_conversion", "string",
           "copy_requested", "lazy_view", "worker", "shared_input"}
X = np.arange(256, dtype=np.float32)  # 1 KiB
KIB = 1024
GLOBAL = np.zeros(256, np.float32)


@pytest.fixture(autouse=True)
def fresh_stats(stats_on):
    """Every test here counts from zero (conftest's stats_on)."""
    yield


def _copied(entry):
    return {reason: n for reason, n in entry.bytes_copied.items() if n}


def _run(func, inp, Tout, mode, **kwargs):
    """Runs the op eagerly or inside a tf.function (on TF's worker threads)."""
    if mode == "eager":
        return pfb.numpy_function(func, inp, Tout, **kwargs)
    return tf.function(lambda: pfb.numpy_function(func, inp, Tout, **kwargs))()


MODES = ["eager", "graph"]


@pytest.mark.parametrize("mode", MODES)
def test_aligned_fresh_output_is_zero_copy(mode):
    _run(lambda a: a * 2, [X], tf.float32, mode, name="double")
    entry = pfb.stats().functions["double"]
    assert entry.calls == 1 and entry.errors == 0
    assert entry.bytes_zero_copy == KIB  # the fresh output
    # The input is a constant TF shares: copied, so that the function may write it.
    assert _copied(entry) == {"shared_input": KIB}
    assert set(entry.bytes_copied) == REASONS


@pytest.mark.parametrize("mode", MODES)
def test_strided_output_is_copied_as_non_contiguous(mode):
    _run(lambda: np.ones((16, 32), np.float32)[:, ::2], [], tf.float32, mode, name="strided")
    entry = pfb.stats().functions["strided"]
    assert entry.bytes_zero_copy == 0
    assert _copied(entry) == {"non_contiguous": 16 * 16 * 4}


@pytest.mark.parametrize("mode", MODES)
def test_copy_true_copies_both_ways(mode):
    _run(lambda a: a, [X], tf.float32, mode, name="private", copy=True)
    entry = pfb.stats().functions["private"]
    assert entry.bytes_zero_copy == 0
    assert _copied(entry) == {"copy_requested": 2 * KIB}


def test_unaligned_output():
    pfb.numpy_function(lambda: np.zeros(257, np.float32)[1:], [], tf.float32, name="unaligned")
    assert _copied(pfb.stats().functions["unaligned"]) == {"unaligned": KIB}


def test_global_array_is_copied_as_aliasing():
    pfb.numpy_function(lambda: GLOBAL, [], tf.float32, name="global")
    assert _copied(pfb.stats().functions["global"]) == {"aliasing": KIB}


def test_pass_through_of_an_input_is_zero_copy():
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="identity", copy=False)
    entry = pfb.stats().functions["identity"]
    assert entry.bytes_zero_copy == 2 * KIB
    assert _copied(entry) == {}


def test_pass_through_of_a_shared_input_copies_it_once():
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="identity")
    entry = pfb.stats().functions["identity"]
    assert entry.bytes_zero_copy == KIB  # the private copy, handed on
    assert _copied(entry) == {"shared_input": KIB}


def test_python_values_count_as_dtype_conversion():
    pfb.numpy_function(lambda: (2.5, [1, 2, 3]), [], [tf.float64, tf.int32], name="listed")
    assert _copied(pfb.stats().functions["listed"]) == {"dtype_conversion": 8 + 3 * 4}


@pytest.mark.parametrize("mode", MODES)
def test_strings_count_their_bytes_both_ways(mode):
    words = tf.constant([b"abc", b"de", b""])
    _run(lambda s: s[::-1].copy(), [words], tf.string, mode, name="words")
    entry = pfb.stats().functions["words"]
    assert entry.bytes_zero_copy == 0
    assert _copied(entry) == {"string": 2 * 5}


def test_several_outputs_and_inputs_add_up():
    pfb.numpy_function(lambda a, b: (a + b, b[::2]), [X, X], [tf.float32, tf.float32],
                       name="pair")
    entry = pfb.stats().functions["pair"]
    assert entry.bytes_zero_copy == KIB  # a + b
    assert _copied(entry) == {"non_contiguous": KIB // 2, "shared_input": 2 * KIB}


@pytest.mark.parametrize("mode", MODES)
def test_errors_are_counted(mode):
    def broken(a):
        raise ValueError("no")

    with pytest.raises(tf.errors.InvalidArgumentError):
        _run(broken, [X], tf.float32, mode, name="broken")
    with pytest.raises(tf.errors.InvalidArgumentError):
        # (floats for ints: refused in every mode, eagerly too)
        _run(lambda a: a.astype(np.float64) + 0.5, [X], tf.int32, mode, name="broken")
    entry = pfb.stats().functions["broken"]
    assert entry.calls == 2
    assert entry.errors == 2


def test_functions_without_name_are_keyed_by_qualname():
    def unnamed(a):
        return a + 1

    pfb.numpy_function(unnamed, [X], tf.float32)
    pfb.numpy_function(unnamed, [X], tf.float32)
    functions = pfb.stats().functions
    assert functions[unnamed.__qualname__].calls == 2


def test_graph_calls_count_every_run():
    double = tf.function(lambda x: pfb.numpy_function(lambda a: a * 2, [x], tf.float32,
                                                      name="looped"))
    for _ in range(5):
        double(X)
    assert pfb.stats().functions["looped"].calls == 5


def test_parallel_map_counts_every_element():
    dataset = tf.data.Dataset.range(200).map(
        lambda i: pfb.numpy_function(lambda a: a + 1, [i], tf.int64, name="mapped"),
        num_parallel_calls=4)
    assert int(dataset.reduce(tf.constant(0, tf.int64), lambda acc, v: acc + v)) == 20100
    entry = pfb.stats().functions["mapped"]
    assert entry.calls == 200
    # The outputs; the 0-d inputs reach the function as NumPy scalars (values,
    # as TF hands them over), which are not counted as memory.
    assert entry.bytes_zero_copy == 200 * 8


def test_times_are_split_between_function_and_marshalling():
    pfb.numpy_function(lambda a: time.sleep(0.02) or a, [X], tf.float32, name="sleepy")
    entry = pfb.stats().functions["sleepy"]
    assert entry.seconds_in_function >= 0.02
    assert 0 < entry.seconds_marshalling < entry.seconds_in_function


def test_total_sums_the_functions():
    pfb.numpy_function(lambda a: a * 2, [X], tf.float32, name="one")
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="two", copy=True)
    snapshot = pfb.stats()
    assert snapshot.total.calls == 2
    assert snapshot.total.bytes_zero_copy == KIB
    assert _copied(snapshot.total) == {"copy_requested": 2 * KIB, "shared_input": KIB}
    assert snapshot.total.seconds_in_function == pytest.approx(
        sum(e.seconds_in_function for e in snapshot.functions.values()))


def test_reset_clears_the_counters():
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="before")
    pfb.reset_stats()
    assert pfb.stats().functions == {}
    assert pfb.stats().total.calls == 0
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="before")
    assert pfb.stats().functions["before"].calls == 1


def test_graph_function_keeps_counting_after_reset():
    double = tf.function(lambda x: pfb.numpy_function(lambda a: a * 2, [x], tf.float32,
                                                      name="kept"))
    double(X)
    pfb.reset_stats()
    double(X)
    assert pfb.stats().functions["kept"].calls == 1


def test_counting_is_on_by_default():
    """A fresh process counts without enable_stats, copies with their reasons,
    in eager calls and in graphs; enable_stats(False) still switches it off."""
    run = fresh_python("api/stats_counting_is_on_by_default.py", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    on, copied, previous, off = run.stdout.split("\n")[-5:-1]
    assert on == "True 1 24 1"  # 24 bytes out without a copy (the input is shared)
    assert copied == "{'non_contiguous': 24, 'shared_input': 24}"  # the transposed result
    assert previous == "True"
    assert off == "False False"


def test_enable_stats_switches_counting():
    assert pfb.enable_stats(False) is True
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="quiet")
    snapshot = pfb.stats()
    assert "quiet" not in snapshot.functions
    assert snapshot.enabled is False
    assert pfb.enable_stats() is False
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="quiet")
    assert pfb.stats().functions["quiet"].calls == 1


def test_str_is_a_table():
    pfb.numpy_function(lambda: np.ones((4, 4), np.float32).T, [], tf.float32, name="shown")
    text = str(pfb.stats())
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["function", "calls", "errors"]
    row = next(line for line in lines if line.startswith("shown"))
    assert row.split()[1:3] == ["1", "0"]
    assert "non_contiguous 64 B" in row
    assert any(line.startswith("(total)") for line in lines)


def test_str_keeps_wide_numbers_apart():
    # Columns of fixed width ran together once a number outgrew them.
    pfb.numpy_function(lambda a: a, [X], tf.float32, name="wide")
    snapshot = pfb.stats()
    entry = dataclasses.replace(snapshot.functions["wide"], calls=10**12,
                                seconds_in_function=1.5515456e12,
                                seconds_marshalling=1.2345678e12)
    lines = str(dataclasses.replace(snapshot, functions={"wide": entry})).splitlines()
    row = next(line for line in lines if line.startswith("wide"))
    cells = re.split(r"\s{2,}", row)
    assert len(cells) == len(re.split(r"\s{2,}", lines[0]))
    assert cells[1] == str(10**12) and cells[5:7] == ["1551545.60 us", "1234567.80 us"]


# ------------------------------------------------------------ py_function --

def _run_py(func, inp, Tout, mode, **kwargs):
    if mode == "eager":
        return pfb.py_function(func, inp, Tout, **kwargs)
    return tf.function(lambda: pfb.py_function(func, inp, Tout, **kwargs))()


@pytest.mark.parametrize("mode", MODES)
def test_py_function_tensor_output_is_zero_copy(mode):
    _run_py(lambda a: a * 2, [X], tf.float32, mode, name="py_double")
    entry = pfb.stats().functions["py_double"]
    assert entry.calls == 1 and entry.errors == 0
    assert entry.bytes_zero_copy == 2 * KIB  # the EagerTensor input and output
    assert _copied(entry) == {}


@pytest.mark.parametrize("mode", MODES)
def test_py_function_numpy_output_is_copied(mode):
    _run_py(lambda a: a.numpy() * 2, [X], tf.float32, mode, name="py_numpy")
    entry = pfb.stats().functions["py_numpy"]
    assert entry.bytes_zero_copy == KIB  # the input
    assert _copied(entry) == {"aliasing": KIB}


def test_py_function_named_by_its_function():
    def triple(a):
        return a * 3

    _run_py(triple, [X], tf.float32, "graph")
    assert pfb.stats().functions["test_py_function_named_by_its_function.<locals>.triple"].calls == 1


def test_py_function_errors_are_counted():
    def fails(a):
        raise ValueError("no")

    with pytest.raises(tf.errors.InvalidArgumentError):
        _run_py(fails, [X], tf.float32, "graph", name="py_fails")
    entry = pfb.stats().functions["py_fails"]
    assert entry.calls == 1 and entry.errors == 1
