"""Property-based tests of the conversion layer (hypothesis).

- Honest DLPack tensors (random dtype, rank 0-6, sizes including 0, C / F /
  strided / negative / zero strides, an offset inside a real buffer), through
  both capsule kinds (ctypes producer, data pointer or byte_offset) and the
  ``__dlpack__`` producers NumPy and torch: each comes back with NumPy's
  values (byte for byte), zero-copy exactly when the documented rule says so
  (non-empty, 64-byte aligned, compact row-major), and copy=True / copy=False
  behave as documented.
- Malformed tensors (each mutation refusable by construction): a BufferError,
  the capsule left to its producer, and no crash.  They run in a subprocess.
- Results of numpy_function / array_function(torch): random dtype x layout x
  copy mode against NumPy, zero-copy by the documented rule
  (test_conversion_fuzz_results.py).  Both files share fuzz_helpers.py.

Profiles (tests/conftest.py): "ci" by default, ``--hypothesis-profile=long``
or ``HYPOTHESIS_PROFILE=long`` for a deeper run.  ``PFB_FUZZ_FIGURES=path``
writes the counts (tried, refused, wrong, crashed) as JSON.
"""
import json
import os

import numpy as np
import pytest


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, event, given, strategies as st  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402
import dlpack_ctypes as dl  # noqa: E402
from fuzz_helpers import (  # noqa: E402
    BF16, DTYPES, FIGURES, INT64_MAX, address, check_values, conv, fill, tally, wrong)
from fuzz_helpers import write_figures  # noqa: E402,F401 (an autouse fixture)
from conftest import ROOT, TESTS, script_env  # noqa: E402
from fresh_python import fresh_python  # noqa: E402


# ------------------------------------------------------------ honest tensors

@st.composite
def layouts(draw, negative=True):
    """(dtype entry, shape, element strides, start element, buffer size, null strides)."""
    entry = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 6))
    shape = draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank))
    kind = draw(st.sampled_from(["c", "f", "random"]))
    strides = [0] * rank
    if kind == "c" or kind == "f":
        step = 1
        order = range(rank - 1, -1, -1) if kind == "c" else range(rank)
        for i in order:
            strides[i] = step
            step *= max(shape[i], 1)
    else:
        low = -6 if negative else 0
        strides = draw(st.lists(st.integers(low, 6), min_size=rank, max_size=rank))
    empty = 0 in shape
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and not empty)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and not empty)
    shift = draw(st.sampled_from([0, 0, 1, 3, 8, 16, 64]))  # elements past the aligned start
    start = shift - lo
    size = start + hi + 1 + draw(st.integers(0, 3))
    null_strides = kind == "c" and draw(st.booleans())
    return entry, shape, strides, start, size, null_strides


def numpy_view(buf, shape, strides, start):
    item = buf.dtype.itemsize
    return np.lib.stride_tricks.as_strided(buf[start:], shape, [s * item for s in strides],
                                           writeable=False)


def zero_copy_expected(view):
    return view.size > 0 and view.flags.c_contiguous and address(view) % 64 == 0


def check_import(make, view, data_address, what, where):
    """from_dlpack of make() with each copy mode against the documented rule."""
    zero_copy = zero_copy_expected(view)
    for copy in (None, True, False):
        tally("tried", where)
        source = make()
        if copy is False and view.size > 0 and not zero_copy:
            with pytest.raises(BufferError, match="copy=False forbids copies"):
                pfb.from_dlpack(source, copy=False)
            tally("refused", where)
            event("copy=False refused")
            continue
        t = pfb.from_dlpack(source, copy=copy)
        check_values(pfb.to_numpy(t), view, f"{what} copy={copy}", where)
        if view.size == 0:
            continue
        shared = address(pfb.to_numpy(t)) == data_address
        if shared != (zero_copy and copy is not True):
            wrong(f"{what} copy={copy}: zero-copy {shared}, the rule says "
                  f"{zero_copy and copy is not True}", where)
        event("zero-copy" if shared else "copied")


@given(layouts(), st.sampled_from(["versioned", "legacy"]), st.booleans(),
       st.integers(0, 2 ** 32))
def test_honest_capsules_come_back_with_numpys_values(layout, kind, via_offset, seed):
    (dtype, code, bits), shape, strides, start, size, null_strides = layout
    buf = fill(dtype, size, seed)
    view = numpy_view(buf, shape, strides, start)
    producer = dl.Producer()
    kwargs = dict(versioned=kind == "versioned", shape=shape,
                  dtype=dl.DLDataType(code, bits, 1),
                  strides=None if null_strides else strides)

    def make():
        if via_offset:  # data at the buffer's start, the view at byte_offset
            return producer.capsule(buf, byte_offset=start * dtype.itemsize, **kwargs)
        return producer.capsule(buf[start:], **kwargs)

    event(f"rank {len(shape)}")
    check_import(make, view, address(buf[start:]), f"{kind} {dtype} {shape} {strides}",
                 "honest capsules")


@given(layouts(), st.integers(0, 2 ** 32))
def test_numpy_producer(layout, seed):
    (dtype, code, bits), shape, strides, start, size, null_strides = layout
    assume(dtype != BF16)  # NumPy exports only its builtin dtypes
    buf = fill(dtype, size, seed)
    view = numpy_view(buf, shape, strides, start)
    check_import(lambda: view, view, address(view), f"numpy {dtype} {shape} {strides}",
                 "numpy producer")


@given(layouts(negative=False), st.integers(0, 2 ** 32))
def test_torch_producer(torch, layout, seed):
    (dtype, code, bits), shape, strides, start, size, null_strides = layout
    buf = fill(dtype, size, seed)
    view = numpy_view(buf, shape, strides, start)
    base = torch.from_numpy(buf.view(np.uint16) if dtype == BF16 else buf)
    if dtype == BF16:
        base = base.view(torch.bfloat16)

    def make():
        return torch.as_strided(base, shape, strides, start)

    check_import(make, view, address(view), f"torch {dtype} {shape} {strides}",
                 "torch producer")


# ---------------------------------------------------------- malformed tensors

MUTATIONS = ["ndim", "negative_dim", "count", "bytes", "stride", "extent", "below_zero",
             "byte_offset", "null_shape", "null_data", "dtype", "lanes", "device", "version",
             "consumed"]


@st.composite
def malformed(draw):
    """(capsule keywords, mutation): an honest tensor made refusable by construction."""
    (dtype, code, bits), shape, strides, start, size, _ = draw(layouts())
    item = dtype.itemsize
    kwargs = dict(shape=list(shape), strides=list(strides), dtype=(code, bits, 1))
    mutation = draw(st.sampled_from(MUTATIONS))
    rank = len(shape)
    if mutation in ("negative_dim", "count", "bytes", "stride", "extent", "below_zero",
                    "null_shape"):
        if rank == 0:  # these need an axis
            shape, strides, rank = [1], [1], 1
            kwargs.update(shape=[1], strides=[1])
    axis = draw(st.integers(0, max(rank - 1, 0)))
    if mutation == "ndim":
        kwargs["ndim"] = draw(st.sampled_from([-1, -2 ** 31, 65, 1000]))
    elif mutation == "negative_dim":
        kwargs["shape"][axis] = draw(st.integers(-2 ** 63, -1))
    elif mutation == "count":  # the element count overflows int64
        kwargs["shape"] = [draw(st.integers(2 ** 62, INT64_MAX))] * 2 + kwargs["shape"]
        kwargs["strides"] = [1, 1] + kwargs["strides"]
        kwargs["shape"] = [max(n, 1) for n in kwargs["shape"]]
    elif mutation == "bytes":  # the count fits, the byte size does not
        kwargs["dtype"] = (dl.kDLFloat, 64, 1)
        kwargs["shape"] = [max(n, 1) for n in kwargs["shape"]]
        kwargs["shape"][axis] = draw(st.integers(2 ** 60, INT64_MAX))
        kwargs["shape"] = [n if i == axis else 1 for i, n in enumerate(kwargs["shape"])]
    elif mutation == "stride":  # a byte stride that overflows
        item = 8
        kwargs["dtype"] = (dl.kDLFloat, 64, 1)
        kwargs["strides"][axis] = draw(st.one_of(st.integers(2 ** 60, INT64_MAX),
                                                 st.integers(-2 ** 63, -2 ** 60 - 1)))
    elif mutation == "extent":  # every byte stride fits, one axis' extent does not
        kwargs["shape"] = [max(n, 1) for n in kwargs["shape"]]
        n = kwargs["shape"][axis] = draw(st.integers(3, 2 ** 20))
        low = -(-(2 ** 63 + 1) // ((n - 1) * item))  # (n - 1) * |step| > 2**63
        stride = draw(st.integers(low, INT64_MAX // item))  # |step| fits int64
        kwargs["strides"][axis] = stride * draw(st.sampled_from([1, -1]))
    elif mutation == "below_zero":  # in range, but below address 0 from the data
        kwargs["shape"] = [max(n, 1) for n in kwargs["shape"]]
        kwargs["shape"][axis] = 2
        kwargs["strides"][axis] = -draw(st.integers(2 ** 56 // item, (2 ** 62) // item))
    elif mutation == "byte_offset":
        kwargs["byte_offset"] = draw(st.integers(2 ** 63, 2 ** 64 - 1))
    elif mutation == "null_shape":
        kwargs["null_shape"] = True
    elif mutation == "null_data":
        kwargs["shape"] = [max(n, 1) for n in kwargs["shape"]]
        kwargs["null_data"] = True
    elif mutation == "dtype":
        kwargs["dtype"] = draw(st.one_of(
            st.tuples(st.sampled_from([3, 7, 8, 9, 10, 99, 255]), st.sampled_from([8, 16, 32, 64]),
                      st.just(1)),
            st.tuples(st.sampled_from([0, 1]), st.sampled_from([1, 4, 7, 12, 128]), st.just(1)),
            st.tuples(st.just(2), st.sampled_from([8, 24, 80, 128]), st.just(1)),
            st.tuples(st.just(5), st.sampled_from([16, 32, 256]), st.just(1)),
            st.tuples(st.just(6), st.sampled_from([1, 16, 32]), st.just(1))))
    elif mutation == "lanes":
        kwargs["dtype"] = (code, bits, draw(st.integers(2, 2 ** 16 - 1)))
    elif mutation == "device":
        # Not CUDA (2): with a GPU it is accepted.
        kwargs["device"] = (draw(st.sampled_from([3, 4, 7, 8, 10, 13, 14, 99, -1])),
                            draw(st.integers(-2 ** 31, 2 ** 31 - 1)))
    elif mutation == "version":
        kwargs["version"] = (draw(st.sampled_from([0, 2, 3, 2 ** 32 - 1])),
                             draw(st.integers(0, 2 ** 32 - 1)))
    versioned = mutation == "version" or draw(st.booleans())
    return dict(kwargs, versioned=versioned), mutation, size, dtype.str


def _malformed_case(case):
    """One malformed tensor: refused, left to its producer, freed once."""
    kwargs, mutation, size, _ = case
    kwargs = dict(kwargs)
    kwargs["dtype"] = dl.DLDataType(*kwargs["dtype"])
    with conv.aligned_allocation():
        buf = np.zeros(max(size, 1) * 16, np.uint8)
    producer = dl.Producer()
    if mutation == "consumed":
        capsule = producer.capsule(np.zeros(64, np.float32), versioned=kwargs["versioned"])
        pfb.from_dlpack(capsule)  # the second import below is the malformed one
    else:
        capsule = producer.capsule(buf, **kwargs)
    tally("tried", "malformed")
    try:
        pfb.from_dlpack(capsule)
    except BufferError:
        tally("refused", "malformed")
    else:
        wrong(f"accepted a malformed tensor: {mutation} {kwargs}", "malformed")
    if mutation != "consumed":
        if dl.capsule_name(capsule) not in ("dltensor", "dltensor_versioned"):
            wrong(f"a refused capsule was renamed: {mutation}", "malformed")
        before = producer.deleted
        del capsule  # no cycles: its destructor runs now
        if producer.deleted != before + 1:
            wrong(f"a refused capsule was freed {producer.deleted - before} times: "
                  f"{mutation}", "malformed")
    event(mutation)


@given(malformed())
def malformed_inner(case):
    """Run in a subprocess by test_malformed_tensors_are_refused: writes the
    case to PFB_FUZZ_LAST before trying it, so a crash names it."""
    with open(os.environ["PFB_FUZZ_LAST"], "w") as f:
        f.write(repr(case))
    _malformed_case(case)


def test_malformed_tensors_are_refused(request, tmp_path):
    profile = (request.config.getoption("hypothesis_profile", None)
               or os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    last = tmp_path / "last_case"
    here = os.path.dirname(os.path.abspath(__file__))  # the script imports this module
    env = script_env(ROOT, TESTS, here, PFB_FUZZ_LAST=str(last), TF_CPP_MIN_LOG_LEVEL="3")
    proc = fresh_python("conversion/fuzz_malformed_tensors_are_refused.py", profile,
                        env=env, timeout=3000)
    figures = [line for line in proc.stdout.splitlines() if line.startswith("FIGURES ")]
    if figures:
        FIGURES.update(json.loads(figures[-1][len("FIGURES "):]))
    if proc.returncode < 0:
        tally("crashed", "malformed")
        pytest.fail(f"the interpreter died (signal {-proc.returncode}) on "
                    f"{last.read_text() if last.exists() else '?'}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert figures, proc.stdout[-3000:]
