"""The conversion layer alone: the aligned allocator, the error table, and the
bridge entry point driven by a ctypes DLPack producer (malformed tensors,
ownership on every path)."""
import ctypes
import gc

import numpy as np
import pytest

import pyfunc_bridge as pfb
import dlpack_ctypes as dl

conv = pfb._library.conversion()


# --------------------------------------------------------------- allocator --

@pytest.mark.parametrize("size", [1, 7, 16, 33, 100, 4095, 100_000, 3_000_001])
def test_aligned_allocation_for_any_size(size):
    with conv.aligned_allocation():
        a = np.empty(size, np.uint8)
        z = np.zeros(size, np.uint8)
    assert a.ctypes.data % 64 == 0
    assert z.ctypes.data % 64 == 0
    assert not z.any()


def test_handler_is_restored_and_arrays_outlive_it():
    before = np._core.multiarray.get_handler_name()
    with conv.aligned_allocation():
        a = np.arange(1000)
        inside = np._core.multiarray.get_handler_name()
    assert inside == "pyfunc_bridge_aligned64"
    assert np._core.multiarray.get_handler_name() == before
    assert np._core.multiarray.get_handler_name(a) == "pyfunc_bridge_aligned64"
    a.resize(50_000, refcheck=False)  # realloc through the handler that made it
    assert a.ctypes.data % 64 == 0
    assert (a[:1000] == np.arange(1000)).all()
    del a
    gc.collect()


MIB = 1 << 20


def _cached(size):
    """How many cached blocks could serve an allocation of `size` bytes."""
    return sum(1 for usable in conv._allocator_cache() if size <= usable <= size * 9 // 8)


def test_large_freed_blocks_are_kept_reused_and_zeroed_by_calloc():
    size = 4 * MIB + 64 * 7  # a size no other test leaves behind
    with conv.aligned_allocation():
        first = np.ones(size, np.uint8)
        before = _cached(size)
        del first  # kept for reuse, not unmapped
        assert _cached(size) == before + 1
        again = np.empty(size, np.uint8)
        assert _cached(size) == before  # taken from the cache: no new pages
        assert again.ctypes.data % 64 == 0
        again[:] = 1
        del again
        zeros = np.zeros(size, np.uint8)  # calloc on the reused block
        assert _cached(size) == before
    assert not zeros.any()


def test_small_blocks_are_not_kept():
    with conv.aligned_allocation():
        before = conv._allocator_cache()
        a = np.ones(100_000, np.uint8)
        del a
    assert conv._allocator_cache() == before


def test_the_cache_holds_at_most_4_blocks_and_128_mib():
    with conv.aligned_allocation():
        blocks = [np.empty(48 * MIB, np.uint8) for _ in range(3)]
        del blocks
        assert len(conv._allocator_cache()) <= 4
        assert sum(conv._allocator_cache()) <= 128 * MIB
        assert _cached(48 * MIB) == 2  # the oldest was released to fit
        blocks = [np.empty(MIB + 64 * i, np.uint8) for i in range(6)]
        del blocks
    assert len(conv._allocator_cache()) == 4
    assert sum(conv._allocator_cache()) <= 128 * MIB


# -------------------------------------------------------------- error table --

@pytest.mark.parametrize("exc,code", [
    (ValueError("v"), 3), (TypeError("t"), 3), (StopIteration(), 11),
    (MemoryError(), 8), (NotImplementedError(), 12), (KeyError("k"), 2),
    (RuntimeError("r"), 2), (ZeroDivisionError(), 2),
    # A ProcessPool's timeout; a function's own TimeoutError stays UNKNOWN, as in TF.
    (pfb.CallTimeoutError("late"), 4), (TimeoutError("t"), 2),
])
def test_error_code_table(exc, code):
    assert conv.error_code(exc) == code


def test_error_message_carries_the_traceback():
    def user_function():
        raise RuntimeError("boom")

    try:
        user_function()
    except RuntimeError as e:
        message = conv.error_message(e)
    assert message.startswith("RuntimeError: boom")
    assert "Traceback (most recent call last)" in message
    assert "user_function" in message


# ------------------------------------------- the entry point, via ctypes --

def test_abi_version(api):
    assert api.abi_version == 6


def test_call_converts_and_consumes_inputs(api, registered):
    seen = {}

    def func(a):
        seen["a"] = a.copy()
        seen["address"] = a.ctypes.data
        return a * 2

    producer = dl.Producer()
    x = np.arange(4, dtype=np.float32)
    code, message, outs = dl.call(api, registered(func), [producer.tensor(x, flags=0)],
                                  [dl.spec()])
    assert (code, message) == (0, None)
    assert producer.deleted == 1
    assert (seen["a"] == x).all()
    out = outs[0].contents
    t = out.dl_tensor
    assert (t.ndim, t.shape[0], t.dtype.code, t.dtype.bits) == (1, 4, dl.kDLFloat, 32)
    assert t.data % 64 == 0
    values = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), (4,))
    assert (values == x * 2).all()
    out.deleter(outs[0])


def test_strided_input_is_viewed_with_its_strides(api, registered):
    producer = dl.Producer()
    x = np.arange(12, dtype=np.float32)
    seen = {}

    def func(a):
        seen["a"] = a.copy()
        return a[0].copy()

    code, message, outs = dl.call(
        api, registered(func), [producer.tensor(x, shape=[3, 2], strides=[4, 2])],
        [dl.spec()])
    assert code == 0, message
    np.testing.assert_array_equal(seen["a"], [[0, 2], [4, 6], [8, 10]])
    outs[0].contents.deleter(outs[0])


@pytest.mark.parametrize("kwargs,words", [
    (dict(ndim=-1), "ndim -1"),
    (dict(ndim=65, shape=[1] * 65), "ndim 65"),
    (dict(null_shape=True), "NULL shape"),
    (dict(shape=[-3]), "negative dimension"),
    (dict(dtype=dl.DLDataType(dl.kDLFloat, 8, 1)), "unsupported DLPack dtype"),
    (dict(dtype=dl.DLDataType(dl.kDLFloat, 32, 4)), "4 lanes"),
    (dict(dtype=dl.DLDataType(99, 32, 1)), "unsupported DLPack dtype"),
])
def test_malformed_inputs_are_rejected_and_still_freed(api, registered, kwargs, words):
    producer = dl.Producer()
    good = producer.tensor(np.zeros(2, np.float32))
    bad = producer.tensor(np.zeros(3, np.float32), **kwargs)
    code, message, outs = dl.call(api, registered(lambda a, b: a), [good, bad], [dl.spec()])
    assert code == 2  # BufferError: UNKNOWN
    assert "BufferError" in message and words in message
    assert producer.deleted == 2
    assert not outs[0]


def test_missing_key_names_it_and_frees_inputs(api):
    producer = dl.Producer()
    code, message, outs = dl.call(
        api, "tests:nowhere@0", [producer.tensor(np.zeros(1, np.float32))], [dl.spec()])
    assert code == 3
    assert "tests:nowhere@0" in message
    assert producer.deleted == 1


def test_output_error_after_a_good_output_releases_the_good_one(api, registered):
    refs = []

    class Tracked(np.ndarray):
        pass

    def func():
        good = np.ones(3, np.float32).view(Tracked)
        refs.append(__import__("weakref").ref(good))
        return good, np.ones(3, np.float64)

    code, message, outs = dl.call(api, registered(func), [], [dl.spec(), dl.spec()])
    assert code == 3 and "output 1" in message
    assert not outs[0] and not outs[1]
    gc.collect()
    assert refs[0]() is None


def test_declared_shape_is_checked(api, registered):
    code, message, _ = dl.call(api, registered(lambda: np.zeros(3, np.float32)), [],
                               [dl.spec(shape=[-1, 2])])
    assert code == 3
    assert "shape (None, 2)" in message and "(3,)" in message
