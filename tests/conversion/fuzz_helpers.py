"""What the property-based tests of the conversion layer share
(test_conversion_fuzz*.py): the dtypes with their DLPack codes, the figures
they report (PFB_FUZZ_FIGURES), and the checks of a result against NumPy."""
import collections
import json
import os

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import dlpack_ctypes as dl
import pyfunc_bridge as pfb

conv = pfb._library.conversion()
BF16 = np.dtype(ml_dtypes.bfloat16)
# (NumPy dtype, DLPack code, bits)
DTYPES = [(np.dtype(t), code, bits) for t, code, bits in [
    (np.float16, dl.kDLFloat, 16), (np.float32, dl.kDLFloat, 32), (np.float64, dl.kDLFloat, 64),
    (BF16, dl.kDLBfloat, 16),
    (np.int8, dl.kDLInt, 8), (np.int16, dl.kDLInt, 16), (np.int32, dl.kDLInt, 32),
    (np.int64, dl.kDLInt, 64),
    (np.uint8, dl.kDLUInt, 8), (np.uint16, dl.kDLUInt, 16), (np.uint32, dl.kDLUInt, 32),
    (np.uint64, dl.kDLUInt, 64),
    (np.complex64, dl.kDLComplex, 64), (np.complex128, dl.kDLComplex, 128),
    (np.bool_, dl.kDLBool, 8)]]
INT64_MAX = 2 ** 63 - 1

# Counts for the report (the test asserts; these say how much was explored).
FIGURES = collections.Counter()


# Autouse in each test module that imports it: at a module's end, the figures
# of every module run so far.
@pytest.fixture(scope="module", autouse=True)
def write_figures():
    yield
    path = os.environ.get("PFB_FUZZ_FIGURES")
    if path:
        with open(path, "w") as f:
            json.dump(dict(FIGURES), f, indent=1, sort_keys=True)


def tally(what, where):
    """Counts `what` (tried, refused, wrong, crashed) in total and for `where`."""
    FIGURES[what] += 1
    FIGURES[f"{where}: {what}"] += 1


def run_or_refused(op, copy, where):
    """(op(), False), or (None, True) when copy=False refused the copy it
    needed (tallied as refused for `where`); any other error propagates."""
    try:
        return op(), False
    except tf.errors.InvalidArgumentError as e:
        if copy is False and "copy=False forbids copies" in e.message:
            tally("refused", where)
            return None, True
        raise


def wrong(message, where="?"):
    tally("wrong", where)
    raise AssertionError(message)


def raw_bytes(a):
    return np.array(a, order="C").reshape(-1).view(np.uint8)


def check_result(out, seen, rule, copy, want, what, where):
    """An op's result `out` (None when refused): shared with the function's
    result (`seen["address"]`) exactly when the zero-copy `rule` and `copy`
    say so (`rule` None: no rule applies; copy=False is judged by the
    caller), and NumPy's values."""
    if out is None:
        return
    if rule is not None and copy is not False:
        shared = address(pfb.to_numpy(out)) == seen["address"]
        if shared != (rule and copy is not True):
            wrong(f"zero-copy {shared}, the rule says {rule and copy is not True}: {what}",
                  where)
    check_values(pfb.to_numpy(out), want, what, where)


def check_values(got, want, what, where):
    got = np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        wrong(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}", where)
    if not np.array_equal(raw_bytes(got), raw_bytes(want)):
        wrong(f"{what}: values differ\n got {got!r}\nwant {want!r}", where)


def address(a):
    return np.asarray(a).__array_interface__["data"][0]


def fill(dtype, count, seed):
    """`count` elements of `dtype` from random bytes (bool: 0/1), 64-byte aligned."""
    rng = np.random.default_rng(seed)
    with conv.aligned_allocation():
        buf = np.empty(count, dtype)
    if dtype == np.bool_:
        buf[...] = rng.integers(0, 2, count).astype(bool)
    else:
        buf.view(np.uint8)[...] = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return buf
