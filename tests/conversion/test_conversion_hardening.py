"""Holes found by the hardening pass (issue 14, part A), one test group per
hole: byte extents that overflow 64 bits, byte sizes, torch's lazy
conjugate/negative views, byte_offset, odd producer classes, Python values
that convert losslessly, empty torch results, the handler cache and
``__dlpack_device__`` results.  Anything that crashed before its fix runs in
a subprocess."""
import gc
import json
import weakref

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import dlpack_ctypes as dl
from conftest import ROOT, TESTS, address, collect, script_env
from fresh_python import fresh_python

conv = pfb._library.conversion()
KINDS = pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
F64 = dl.DLDataType(dl.kDLFloat, 64, 1)


def aligned(values, dtype=np.float32):
    with conv.aligned_allocation():
        return np.array(values, dtype=dtype)


def refused(make, words, producer, **kwargs):
    """from_dlpack of the capsule make() returns is a BufferError matching
    `words`, and the capsule stays with its producer, which frees it once it
    is dropped.  (Made here: Python 3.10 keeps a call's arguments on the
    caller's stack until it returns.)"""
    capsule = make()
    with pytest.raises(BufferError, match=words):
        pfb.from_dlpack(capsule, **kwargs)
    assert dl.capsule_name(capsule) in ("dltensor", "dltensor_versioned")
    deleted = producer.deleted
    del capsule
    collect()
    assert producer.deleted == deleted + 1


# ------------------------------- holes 1 and 2: extents that overflow 64 bits

# (capsule keywords, words of the BufferError).  float32 unless dtype= says.
OVERFLOWING = [
    # Strides whose byte value overflows (before: wrong values, or SIGSEGV).
    (dict(shape=[2], strides=[2 ** 62]), "overflows 64 bits.*axis 0"),
    (dict(shape=[2], strides=[2 ** 63 - 1]), "overflows 64 bits.*axis 0"),
    (dict(shape=[2], strides=[-2 ** 63]), "overflows 64 bits.*axis 0"),
    (dict(shape=[2], strides=[2 ** 61 + 1]), "overflows 64 bits.*axis 0"),
    (dict(shape=[2], strides=[-2 ** 61 - 1]), "overflows 64 bits.*axis 0"),
    # Each byte stride fits, the extent of an axis or of all axes does not.
    (dict(shape=[3, 2], strides=[2 ** 60, 1]), "overflows 64 bits"),
    (dict(shape=[4, 2 ** 30], strides=[2 ** 59, 2 ** 31]), "overflows 64 bits"),
    (dict(shape=[2 ** 20, 2 ** 20], strides=[-2 ** 42, -1]), "overflows 64 bits"),
    # An offset past int64, and an extent reaching below address 0.
    (dict(shape=[2], byte_offset=2 ** 63 + 64), "byte_offset"),
    (dict(shape=[2], strides=[-2 ** 60]), "below address 0"),
    # Byte sizes that overflow (before: accepted, only the count was checked).
    (dict(shape=[2 ** 61], dtype=(dl.kDLFloat, 64)), "too large to address"),
    (dict(shape=[2 ** 60], dtype=(dl.kDLFloat, 64)), "too large to address"),
    (dict(shape=[2 ** 31, 2 ** 31, 4], dtype=(dl.kDLComplex, 128)), "too large to address"),
    (dict(shape=[2 ** 62, 2]), "too large to address"),
]


def test_extents_that_overflow_are_refused():
    # Some cases crashed before the fix: all run in one fresh interpreter,
    # which prints one line per case.
    proc = fresh_python("conversion/hardening_extents_that_overflow.py",
                        json.dumps(OVERFLOWING), timeout=120,
                        env=script_env(ROOT, TESTS, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * len(OVERFLOWING) + 1, proc.stdout
    for line in lines[:-1]:
        assert line.startswith("REFUSED"), line
    # Every refused capsule stayed with its producer, which freed it once.
    assert lines[-1] == f"deleted {2 * len(OVERFLOWING)}", proc.stdout


@KINDS
def test_large_but_representable_strides_still_work(versioned):
    # Honest negative and size-1 strides are unaffected by the checks.
    producer = dl.Producer()
    a = aligned(np.arange(10))
    t = pfb.from_dlpack(producer.capsule(a[9:], versioned=versioned, shape=[10],
                                         strides=[-1]))
    np.testing.assert_array_equal(t.numpy(), a[::-1])
    t = pfb.from_dlpack(producer.capsule(a, versioned=versioned, shape=[1, 10],
                                         strides=[2 ** 40, 1]), copy=False)
    assert address(t) == a.ctypes.data


@KINDS
def test_element_count_is_a_product_not_a_sum_of_bit_lengths(versioned):
    producer = dl.Producer()
    a = aligned([7.0])
    t = pfb.from_dlpack(producer.capsule(a, versioned=versioned, shape=[1] * 64))
    assert t.shape == (1,) * 64
    assert t.numpy().ravel().tolist() == [7.0]
    assert address(t) == a.ctypes.data
    t = pfb.from_dlpack(producer.capsule(a, versioned=versioned, shape=[1] * 32 + [0] * 32))
    assert t.shape.num_elements() == 0


def test_empty_tensor_with_huge_dimensions():
    # Huge dimensions beside a zero: NumPy cannot view the tensor (it counts
    # the non-zero dimensions), so it is refused cleanly; representable ones
    # with any stride are accepted (no byte is ever read).
    producer = dl.Producer()
    refused(lambda: producer.capsule(aligned(np.arange(4)), shape=[0, 2 ** 62, 2 ** 62]),
            "too large to address", producer)
    t = pfb.from_dlpack(producer.capsule(aligned(np.arange(4)), shape=[0, 2 ** 40],
                                         strides=[2 ** 50, -2 ** 50]))
    assert t.shape == (0, 2 ** 40)


# -------------------------------------- hole 3: torch lazy conjugate / negative

def lazy_views(torch):
    z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    r = torch.tensor([1.0, -2.0, 3.0])
    return [
        ("conj", z.conj(), np.array([1 - 2j, -3 + 4j], np.complex64)),
        ("neg", r._neg_view(), np.array([-1.0, 2.0, -3.0], np.float32)),
        ("neg_complex", z._neg_view(), np.array([-1 - 2j, 3 + 4j], np.complex64)),
        ("conj_neg", z.conj()._neg_view(), np.array([-1 + 2j, 3 - 4j], np.complex64)),
        ("conj_2d_t", torch.tensor([[1 + 1j, 2j], [3, 4 - 1j]]).conj().t(),
         np.array([[1 - 1j, 3], [-2j, 4 + 1j]], np.complex64)),
    ]


def test_from_dlpack_resolves_torch_lazy_views(torch):
    for name, view, want in lazy_views(torch):
        assert view.is_conj() or view.is_neg(), name
        t = pfb.from_dlpack(view)
        np.testing.assert_array_equal(t.numpy(), want, err_msg=name)
        # Resolving is a copy: the tensor does not share the view's memory.
        assert address(t) != view.data_ptr(), name
        assert view.is_conj() or view.is_neg(), name  # the producer's tensor is untouched
        with pytest.raises(BufferError, match="lazy conjugate or negative view"):
            pfb.from_dlpack(view, copy=False)


@pytest.mark.parametrize("copy", [None, True])
def test_array_function_resolves_torch_lazy_views(torch, copy):
    def conj(a):
        return torch.conj(a)

    x = tf.constant([1 + 2j, 3 - 4j], tf.complex64)
    for f in (lambda x: pfb.array_function(conj, [x], tf.complex64, framework="torch",
                                           copy=copy),
              tf.function(lambda x: pfb.array_function(conj, [x], tf.complex64,
                                                       framework="torch", copy=copy))):
        np.testing.assert_array_equal(f(x).numpy(), [1 - 2j, 3 + 4j])
    y = tf.constant([1.0, -2.0])
    got = pfb.array_function(lambda a: a._neg_view(), [y], tf.float32, framework="torch",
                             copy=copy)
    np.testing.assert_array_equal(got.numpy(), [-1.0, 2.0])
    assert not np.shares_memory(pfb.to_numpy(got), pfb.to_numpy(y))


def test_array_function_lazy_view_under_copy_false_says_why(torch):
    x = tf.constant([1 + 2j], tf.complex64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lazy conjugate or negative"):
        pfb.array_function(torch.conj, [x], tf.complex64, framework="torch", copy=False)


def test_lazy_view_copy_is_counted_with_its_own_reason(torch):
    was = pfb.enable_stats()
    try:
        pfb.reset_stats()
        x = tf.constant([1 + 2j, 3 - 4j], tf.complex64)
        pfb.array_function(torch.conj, [x], tf.complex64, framework="torch",
                           name="hardening_conj")
        s = pfb.stats().functions["hardening_conj"]
        assert s.bytes_copied["lazy_view"] == 16
        assert sum(s.bytes_copied.values()) == 16
    finally:
        pfb.enable_stats(was)


def test_jax_results_have_no_lazy_views(jax):
    # JAX computes conj eagerly: its __dlpack__ path gives the values.
    jnp = jax.numpy
    x = tf.constant([1 + 2j, 3 - 4j], tf.complex64)
    got = pfb.array_function(jnp.conj, [x], tf.complex64, framework="jax")
    np.testing.assert_array_equal(got.numpy(), [1 - 2j, 3 + 4j])
    np.testing.assert_array_equal(pfb.from_dlpack(-jnp.asarray([1.0, 2.0])).numpy(),
                                  [-1.0, -2.0])


# ------------------------------------------------------- hole 4: byte_offset

@pytest.mark.parametrize("offset", [64, 4096])
@KINDS
def test_aligned_byte_offset_is_folded_into_the_pointer(versioned, offset):
    producer = dl.Producer()
    a = aligned(np.arange(2048))
    n = (a.nbytes - offset) // 4
    t = pfb.from_dlpack(producer.capsule(a, versioned=versioned, shape=[n],
                                         byte_offset=offset), copy=False)
    np.testing.assert_array_equal(t.numpy(), a[offset // 4:])
    assert address(t) == a.ctypes.data + offset  # zero-copy, at the offset
    del t
    collect()
    assert producer.deleted == 1  # the producer's deleter ran, once


def test_byte_offset_in_array_function_result(torch):
    producer = dl.Producer()
    a = aligned(np.arange(32))

    def f(x):
        return dl.Exporter(producer.capsule(a, shape=[16], byte_offset=64))

    got = pfb.array_function(f, [tf.constant(1.0)], tf.float32, framework="torch")
    np.testing.assert_array_equal(got.numpy(), a[16:])


# ------------------------------------------- hole 5: class without a module

def test_producer_class_whose_module_is_none(torch):
    a = aligned([1.0, 2.0])

    class Producer:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (dl.kDLCPU, 0)

    Producer.__module__ = None
    t = pfb.from_dlpack(Producer())
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    got = pfb.array_function(lambda x: Producer(), [tf.constant(1.0)], tf.float32,
                             framework="torch")
    np.testing.assert_array_equal(got.numpy(), [1.0, 2.0])


# --------------------------------------- hole 10: lossless Python values

ACCEPTED_VALUES = [
    ([], tf.int32, np.zeros([0], np.int32)),
    ([[], []], tf.uint8, np.zeros([2, 0], np.uint8)),
    ([], tf.bool, np.zeros([0], bool)),
    (1.5, tf.bfloat16, np.array(1.5, ml_dtypes.bfloat16)),
    ([1.0, 2.0], tf.bfloat16, np.array([1.0, 2.0], ml_dtypes.bfloat16)),
    (3, tf.bfloat16, np.array(3, ml_dtypes.bfloat16)),
    ([2 ** 64 - 1, 5], tf.uint64, np.array([2 ** 64 - 1, 5], np.uint64)),
    (2 ** 64 - 1, tf.uint64, np.array(2 ** 64 - 1, np.uint64)),
    (2 ** 100, tf.float32, np.array(2.0 ** 100, np.float32)),   # exactly a float32
    ([2 ** 70, 1.5], tf.float64, np.array([2.0 ** 70, 1.5])),
    (2 ** 100, tf.complex64, np.array(2.0 ** 100, np.complex64)),
    (float("inf"), tf.float32, np.array(np.inf, np.float32)),   # inf stays inf
    ([True, False], tf.int8, np.array([1, 0], np.int8)),
    # The largest finite values, and the last ones that round down to them.
    (65504.0, tf.float16, np.array(65504, np.float16)),
    (65519.99, tf.float16, np.array(65504, np.float16)),
    ([3.4028234663852886e38], tf.float32, np.array([3.4028234663852886e38], np.float32)),
    (-3.4028235677973362e38, tf.float32, np.array(-3.4028234663852886e38, np.float32)),
    (3.3895313892515355e38 + 1j, tf.complex64, np.array(3.3895313892515355e38 + 1j,
                                                        np.complex64)),
]


@pytest.mark.parametrize("value,dtype,want", ACCEPTED_VALUES,
                         ids=[f"{v!r:.20}-{d.name}" for v, d, _ in ACCEPTED_VALUES])
def test_python_values_that_convert_losslessly_are_accepted(value, dtype, want):
    got = pfb.numpy_function(lambda: [value], [], [dtype])  # eagerly: a tensor, as TF's
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), want)


REFUSED_VALUES = [
    (2 ** 200, tf.float32, "overflows"),
    (1e300, tf.float32, "overflows"),
    ([1.0, 1e39], tf.float32, "overflows"),
    (1e300 + 1e300j, tf.complex64, "overflows"),
    (1e39, tf.bfloat16, "overflows"),
    (65520.0, tf.float16, "overflows"),                  # rounds to inf
    (3.4028235677973366e38, tf.float32, "overflows"),
    (-3.4028235677973366e38, tf.float32, "overflows"),
    (1 + 3.4028235677973366e38j, tf.complex64, "overflows"),
    (3.396177427818412e38, tf.bfloat16, "overflows"),
    (10 ** 400, tf.float64, "too large"),
    ([2 ** 64, 5], tf.uint64, "out of bounds"),
    ([-1], tf.uint32, "out of bounds"),
    (300, tf.int8, "out of bounds"),
    (1.5, tf.int32, "float values"),
    ([1, 2.0], tf.int64, "float values"),
    (1j, tf.float64, "complex values"),
    (2, tf.bool, "int values"),
    ([2 ** 70, 1j], tf.float64, "complex values"),
]


@pytest.mark.parametrize("value,dtype,words", REFUSED_VALUES,
                         ids=[f"{v!r:.20}-{d.name}" for v, d, _ in REFUSED_VALUES])
def test_lossy_python_values_are_refused_with_value_and_dtype(value, dtype, words):
    def f():
        return [1, value]

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        pfb.numpy_function(f, [], [tf.int32, dtype])
    message = info.value.message
    assert "output 1" in message
    assert dtype.name in message
    assert words in message
    assert repr(value)[:20] in message


def test_huge_value_in_a_message_is_shortened():
    value = list(range(10 ** 5)) + [1.5]
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        pfb.numpy_function(lambda: [value], [], [tf.int32])
    assert len(info.value.message) < 2000
    assert "[0, 1, 2, 3" in info.value.message


# ------------------------------------- hole 11: empty torch results, copy=False

def test_empty_torch_results_under_copy_false(torch):
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    keep = torch.empty(0, 3)
    cases = {
        "view_of_input": lambda a: a[:0],
        "fresh": lambda a: torch.empty(0, 3),
        "global": lambda a: keep,
        "transposed": lambda a: torch.empty(3, 0).t(),
        "strided_view": lambda a: a[:, ::2][:0],
    }
    for name, f in cases.items():
        got = pfb.array_function(f, [x], tf.TensorSpec([None, None], tf.float32),
                                 framework="torch", copy=False)
        assert got.shape.num_elements() == 0, name
        assert got.dtype == tf.float32, name
        got = tf.function(lambda x: pfb.array_function(
            f, [x], tf.float32, framework="torch", copy=False))(x)
        assert got.shape.num_elements() == 0, name


# ---------------------------------------------- hole 12: bounded class cache

def test_handler_cache_keeps_no_class_alive():
    a = aligned([1.0, 2.0])
    refs = []
    for i in range(2000):
        cls = type(f"Dynamic{i}", (), {
            "__dlpack__": lambda self, **kw: a.__dlpack__(**kw),
            "__dlpack_device__": lambda self: (dl.kDLCPU, 0)})
        refs.append(weakref.ref(cls))
        pfb.from_dlpack(cls())
        del cls
    collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} of 2000 classes are still alive"


def test_handler_cache_judges_each_class_after_purges(torch):
    # Entries leave with their classes; a torch subclass made afterwards (a
    # new class, maybe at a dead one's address) is still judged by torch's
    # adapter: its lazy view is resolved.
    a = aligned([1.0, 2.0])
    for i in range(3):
        cls = type("Plain", (), {
            "__dlpack__": lambda self, **kw: a.__dlpack__(**kw),
            "__dlpack_device__": lambda self: (dl.kDLCPU, 0)})
        pfb.from_dlpack(cls())
        del cls
        gc.collect()
        sub = type("Sub", (torch.Tensor,), {"__module__": "torch.hardening"})
        t = torch.tensor([1 + 2j]).conj().as_subclass(sub)
        np.testing.assert_array_equal(pfb.from_dlpack(t).numpy(), [1 - 2j])


# ------------------------------------ hole 13: malformed __dlpack_device__

@pytest.mark.parametrize("device", [(1,), (1, 0, 0), None, "cpu", (1.5, 0), ("1", "0")],
                         ids=str)
def test_dlpack_device_must_be_a_pair_of_ints(device, torch):
    a = aligned([1.0, 2.0])

    class Producer:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return device

    with pytest.raises(BufferError, match=r"__dlpack_device__\(\) returned .*; the DLPack "
                                          r"protocol requires a \(device_type, device_id\) "
                                          r"tuple of two ints"):
        pfb.from_dlpack(Producer())
    # A malformed DLPack result is an UnknownError naming the BufferError, like
    # the other malformed results.
    with pytest.raises(tf.errors.UnknownError, match="BufferError.*tuple of two ints"):
        pfb.array_function(lambda x: Producer(), [tf.constant(1.0)], tf.float32,
                           framework="torch")
