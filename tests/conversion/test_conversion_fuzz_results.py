"""Property-based tests of the conversion layer (hypothesis): results of
numpy_function / array_function(torch), random dtype x layout x copy mode
against NumPy, zero-copy by the documented rule.  Profiles and figures as in
test_conversion_fuzz.py."""
import numpy as np
import pytest
import tensorflow as tf

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import event, given, strategies as st  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402
from fuzz_helpers import (  # noqa: E402
    BF16, DTYPES, address, check_result, run_or_refused, tally, wrong)
from fuzz_helpers import write_figures  # noqa: E402,F401 (an autouse fixture)

GLOBALS = {}


@st.composite
def results(draw, sources):
    entry = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    source = draw(st.sampled_from(sources))
    copy = draw(st.sampled_from([None, True, False]))
    seed = draw(st.integers(0, 2 ** 32))
    return entry, shape, source, copy, seed


def values(dtype, shape, seed):
    """Small values (no NaN): exact through every path, lists included."""
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 100, shape)
    return (v % 2).astype(dtype) if dtype == np.bool_ else v.astype(dtype)


NUMPY_SOURCES = ["fresh", "fortran", "strided", "negative", "unaligned", "global", "list",
                 "input_view"]


def numpy_result(source, want):
    """Inside the function: `want`'s values laid out as `source` says.
    Returns (result, whether the result is private memory of the function)."""
    if source == "fresh":
        return want.copy(), True
    if source == "fortran":
        return np.array(want, order="F"), True
    if source == "strided":
        big = np.repeat(want.reshape(-1), 2).reshape(want.shape + (2,)) if want.ndim else None
        if big is None:
            return want.copy(), True
        return big[..., 0], True
    if source == "negative":
        flipped = np.flip(want).copy()
        return np.flip(flipped), True
    if source == "unaligned":
        raw = np.empty(want.size + 1, want.dtype)
        raw[1:] = want.reshape(-1)
        return raw[1:].reshape(want.shape), True
    if source == "global":
        GLOBALS["last"] = want.copy()
        return GLOBALS["last"], False
    if source == "list":
        return want.tolist(), None
    raise AssertionError(source)


@given(results(NUMPY_SOURCES))
def test_numpy_function_results(case):
    (dtype, code, bits), shape, source, copy, seed = case
    want = values(dtype, shape, seed)
    if source == "list" and dtype == BF16:
        source = "fresh"  # bfloat16 tolist gives ml_dtypes scalars, not Python values
    if source == "list" and np.asarray(want.tolist()).shape != want.shape:
        source = "fresh"  # [] for shape (0, 3): a list cannot say that shape
    seen = {}
    x = tf.constant(want)

    def f(a):
        if source == "input_view":
            out, private = a, None  # a read-only view of the input
        else:
            out, private = numpy_result(source, want)
        # Facts, not the object: a reference kept here would make it aliased.
        if isinstance(out, np.ndarray):
            seen.update(address=address(out), size=out.size, private=private,
                        contiguous=out.flags.c_contiguous)
        return [out]  # a list of one output: `out` itself may be a list

    tally("tried", "numpy_function results")
    event(f"{source} copy={copy}")
    outs, needs_copy = run_or_refused(
        lambda: pfb.numpy_function(f, [x], [tf.as_dtype(dtype)], copy=copy), copy,
        "numpy_function results")
    out = None if needs_copy else outs  # eagerly a one-entry Tout gives a tensor, as TF's
    rule = None  # no zero-copy rule for empty or unseen results
    if seen and seen["size"] > 0:
        if source == "input_view":
            rule = True  # TF's memory handed back
        else:
            rule = seen["private"] and seen["contiguous"] and seen["address"] % 64 == 0
        if copy is False:
            if needs_copy and rule:
                wrong(f"copy=False refused a result the rule hands over: {case}",
                      "numpy_function results")
            if not needs_copy and not rule:
                wrong(f"copy=False accepted a result that needs a copy: {case}",
                      "numpy_function results")
    check_result(out, seen, rule, copy, want, f"numpy_function {case}",
                 "numpy_function results")


TORCH_SOURCES = ["fresh", "transposed", "strided", "global", "from_numpy", "lazy_neg",
                 "lazy_conj", "input"]


@given(results(TORCH_SOURCES))
def test_array_function_torch_results(torch, case):
    (dtype, code, bits), shape, source, copy, seed = case
    want = values(dtype, shape, seed)

    def to_torch(a):
        a = np.array(a, order="C")  # np.ascontiguousarray would make 0-d arrays 1-d
        t = torch.from_numpy(a.view(np.uint16) if dtype == BF16 else a)
        return t.view(torch.bfloat16) if dtype == BF16 else t

    if source == "lazy_conj" and dtype.kind != "c":
        source = "fresh"
    if source == "lazy_neg" and dtype.kind in "bu":
        source = "fresh"  # torch has no negation of bool / unsigned
    seen = {}
    x = tf.constant(want)

    def f(a):
        if source == "fresh":
            out = to_torch(want).clone()
        elif source == "transposed":
            out = to_torch(np.transpose(want)).clone()
            out = out.permute(tuple(reversed(range(out.ndim))))
        elif source == "strided":
            big = to_torch(np.stack([want, want], axis=-1)).clone()
            out = big[..., 0]
        elif source == "global":
            GLOBALS["torch"] = to_torch(want).clone()
            out = GLOBALS["torch"]
        elif source == "from_numpy":
            out = to_torch(want.copy())
        elif source == "lazy_neg":
            out = to_torch(-want if dtype.kind != "b" else want).clone()._neg_view()
        elif source == "lazy_conj":
            out = to_torch(np.conj(want)).clone().conj()
        else:
            out = a
        seen.update(address=out.data_ptr(), numel=out.numel(),
                    contiguous=out.is_contiguous())
        return out

    tally("tried", "array_function torch results")
    event(f"torch {source} copy={copy}")
    out, refused = run_or_refused(
        lambda: pfb.array_function(f, [x], tf.as_dtype(dtype), framework="torch", copy=copy),
        copy, "array_function torch results")
    rule = None  # no zero-copy rule for empty results
    if seen["numel"] > 0:
        # Documented rule: a fresh torch tensor (not a view, storage not
        # shared, allocated by torch) or a view of an input, aligned and
        # compact, is handed over; views (even contiguous ones) and memory
        # torch did not allocate are copied; lazy views are resolved (a copy).
        rule = source in ("fresh", "input") and seen["contiguous"]
        if copy is False:
            if refused == rule:
                wrong(f"copy=False {'refused' if refused else 'accepted'} against the "
                      f"rule ({rule}): {case}", "array_function torch results")
    check_result(out, seen, rule, copy, want, f"array_function torch {case}",
                 "array_function torch results")
