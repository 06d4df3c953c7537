"""Process workers: copy=False refuses in a pool exactly what it refuses
in-process; the statistics count the bytes moved; Tout checks and the copy
policy are the in-process ones."""
import pytest
import tensorflow as tf

import copy_functions as cf
import process_functions as pf
from conftest import without_op_label
import pyfunc_bridge as pfb
from process_pool_helpers import apply_function
from process_pool_helpers import pool  # noqa: F401 (fixtures)


F32, C64 = tf.float32, tf.complex64


@pytest.mark.parametrize("func, framework, tout, refused", [
    (cf.fresh, "numpy", F32, None),
    (cf.strided, "numpy", F32, "non_contiguous"),
    (cf.transposed, "numpy", F32, "non_contiguous"),
    (cf.fortran_order, "numpy", F32, "non_contiguous"),
    (cf.unaligned, "numpy", F32, "unaligned"),
    (cf.empty_transposed, "numpy", F32, None),
    (cf.input_itself, "numpy", F32, None),
    (cf.input_rows, "numpy", F32, "non_contiguous"),
    (cf.shared_array, "numpy", F32, "aliasing"),
    (cf.view_of_shared, "numpy", F32, "aliasing"),
    (cf.second_strided, "numpy", [F32, F32], "non_contiguous"),
    # (copy=None converts it to Tout's float32 eagerly; copy=False does not copy.)
    (cf.strided_of_another_dtype, "numpy", F32, "dtype"),
    (cf.strided, "torch", F32, "non_contiguous"),
    (cf.torch_fresh, "torch", F32, None),
    (cf.torch_transposed, "torch", F32, "non_contiguous"),
    (cf.input_itself, "torch", F32, None),
    (cf.torch_input_rows, "torch", F32, "non_contiguous"),
    (cf.torch_view_of_fresh, "torch", F32, "aliasing"),
    (cf.torch_conjugate, "torch", C64, "lazy"),
    (cf.torch_as_numpy, "torch", F32, "aliasing"),
    # Each part of the one rule both sides call (src/copy_facts.h):
    (cf.weakly_held, "numpy", F32, "aliasing"),          # pfb_weakly_referenced
    (cf.view_of_weakly_held, "numpy", F32, "aliasing"),  # pfb_writable_elsewhere's chain
    (cf.input_first_row, "numpy", F32, None),            # its end: an input
    (cf.aligned_view_of_fresh, "numpy", F32, None),      # pfb_array_aligned
    (cf.unaligned_view_of_fresh, "numpy", F32, "unaligned"),
    (cf.kept_list, "numpy", [F32], "aliasing"),          # pfb_item_outside_refs
    (cf.fresh_twice, "numpy", [F32, F32], None),
    (cf.torch_input_first_row, "torch", F32, None),      # pfb_inside
], ids=lambda v: getattr(v, "__name__", None))
def test_copy_false_refuses_in_a_pool_what_it_refuses_in_process(pool, func, framework,
                                                                 tout, refused, eager_path):
    """In-process pfb is the oracle: the same results are refused, with the
    same error class and message; copy=None takes them all alike.  On the
    dispatched path TF labels the message with the op's type, which differs
    for array_function (a pooled call runs on numpy_function's CPU op)."""
    x = tf.reshape(tf.range(12.0), [3, 4])

    def outcome(executor, copy):
        try:
            out = apply_function(func, [x], tout, framework, executor, copy)
        except tf.errors.OpError as exc:
            return type(exc), without_op_label(exc.message)
        return "ok", [o.numpy().tolist() for o in (out if isinstance(out, list) else [out])]

    expected = outcome(None, False)
    assert (expected[0] == "ok") == (refused is None), expected
    if refused not in (None, "dtype"):
        assert "copy=False forbids copies" in expected[1]
    assert outcome(pool, False) == expected
    assert outcome(pool, None) == outcome(None, None)


@pytest.mark.parametrize("func, refused", [(cf.large_fresh, False),
                                           (cf.large_transposed, True)])
def test_copy_false_judges_pickled_results_by_what_the_function_returned(func, refused):
    """A result too large for the arena travels pickled; the array unpickled
    here may be unaligned: that copy is the transport's, not a refusal."""
    def outcome(executor):
        try:
            return "ok", pfb.numpy_function(func, [tf.constant(0.0)], tf.float32,
                                            executor=executor, copy=False).numpy().tolist()
        except tf.errors.InvalidArgumentError as exc:
            return type(exc), exc.message
    with pfb.ProcessPool(1, arena_bytes=4096, name="small copy pool") as small:
        for _ in range(4):  # unpickled arrays land at various addresses
            assert outcome(small) == outcome(None)
    assert (outcome(None)[0] != "ok") == refused


# ----------------------------------------------------------- data movement --

def test_statistics_count_the_bytes_moved_to_and_from_workers(pool):
    previous = pfb.enable_stats(True)
    pfb.reset_stats()
    try:
        pfb.numpy_function(pf.double, [tf.zeros([1024], tf.float32)], tf.float32,
                           executor=pool, name="to a worker")
        entry = pfb.stats().functions["to a worker"]
    finally:
        pfb.enable_stats(previous)
    assert entry.calls == 1
    assert entry.bytes_copied["worker"] == 2 * 4096  # one copy in, one copy out
    assert entry.bytes_zero_copy == 4096  # the result block, handed to TF as it is


def test_tout_checks_and_the_copy_policy_are_unchanged(pool):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0: Tout declares int32 but the function returned "
                             "an array of dtype float64"):
        pfb.numpy_function(pf.float64_array, [tf.constant([1.5])], tf.int32,
                           executor=pool)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"output 1: Tout declares shape \(3,\)"):
        pfb.numpy_function(pf.two_results, [tf.constant([1, 2])],
                           [tf.int32, tf.TensorSpec([3], tf.int32)], executor=pool)
    with pytest.raises(tf.errors.InvalidArgumentError, match="returned 2 value"):
        pfb.numpy_function(pf.two_results, [tf.constant([1])], tf.int32, executor=pool)
