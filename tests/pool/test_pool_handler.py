"""The worker's NumPy data-memory handler (src/pool/_pool.pyx,
ResultArena): a function's fresh arrays land in the result arena while it
runs; only a result nothing else in the worker can reach is handed over
without a copy; blocks go back exactly once, when both sides let go."""
import gc
import mmap
import threading
import weakref

import numpy as np
import pytest

from pyfunc_bridge import _pool as pw

get_handler_name = np._core.multiarray.get_handler_name
ARENA = 1 << 20


@pytest.fixture
def results():
    return pw.ResultArena(mmap.mmap(-1, ARENA), min_bytes=1)


def inside(results, arr):
    address = arr.ctypes.data
    return results.address <= address < results.address + results.size


def test_a_fresh_result_lands_in_the_arena_and_is_handed_over(results):
    out = results.call(np.ones, ((256, 64),))
    assert inside(results, out)
    offset, size = results.take(out)
    assert offset == out.ctypes.data - results.address
    assert offset % pw.ALIGN == 0 and size >= out.nbytes
    assert (out == 1).all()


def test_an_allocation_larger_than_the_arena_falls_back(results):
    before = results.fell_back
    out = results.call(lambda: np.full(ARENA // 8 + 1, 3.0), ())
    assert not inside(results, out) and results.fell_back == before + 1
    assert (out == 3.0).all() and results.take(out) is None
    assert results.live_blocks() == 0


def test_the_handler_is_installed_only_during_the_call(results):
    seen = []

    def probe():
        seen.append(get_handler_name())
        return np.ones(100)
    assert get_handler_name() == "default_allocator"
    out = results.call(probe, ())
    assert seen == [pw.HANDLER_NAME] and get_handler_name() == "default_allocator"
    assert get_handler_name(out) == pw.HANDLER_NAME
    assert not inside(results, np.ones(100))  # after the call: the ordinary allocator

    def fails():
        np.ones(100)
        raise KeyError("inside")
    with pytest.raises(KeyError, match="inside"):
        results.call(fails, ())
    assert get_handler_name() == "default_allocator"
    assert not inside(results, np.ones(100))


def test_other_threads_keep_the_ordinary_allocator(results):
    """The handler is set in this thread's context only."""
    elsewhere = []

    def function():
        thread = threading.Thread(target=lambda: elsewhere.append(np.ones(1000)))
        thread.start()
        thread.join()
        return np.ones(1000)
    out = results.call(function, ())
    assert inside(results, out) and not inside(results, elsewhere[0])


def test_small_allocations_use_the_ordinary_allocator():
    results = pw.ResultArena(mmap.mmap(-1, ARENA))  # min_bytes=64 KiB by default
    small, large = results.call(lambda: (np.ones(8191), np.ones(8192)), ())
    assert not inside(results, small) and inside(results, large)
    assert results.take(small) is None and results.take(large) is not None


# ------------------------------------- what may not be handed over --

kept = {}


def keep_global():
    kept["a"] = np.arange(1000.0)
    return kept["a"]


def view_of_kept():
    kept["b"] = np.arange(1000.0)
    return kept["b"].reshape(10, 100)


def weakly_referenced():
    a = np.arange(1000.0)
    kept["weak"] = weakref.ref(a)
    return a


def strided():
    return np.arange(2000.0)[::2]


def offset_view():
    return np.arange(1000.0)[8:]


@pytest.mark.parametrize("function", [keep_global, view_of_kept, weakly_referenced, strided,
                                      offset_view])
def test_a_result_the_worker_could_still_change_is_not_handed_over(results, function):
    out = results.call(function, ())
    assert inside(results, out)
    assert results.take(out) is None


def test_an_input_view_or_an_earlier_calls_array_is_not_handed_over(results):
    x = np.arange(1000.0)
    assert results.take(results.call(lambda a: a, (x,))) is None
    assert results.take(results.call(lambda a: a.reshape(10, 100), (x,))) is None
    cache = [results.call(np.ones, (1000,))]
    out = results.call(cache.pop, ())  # nothing else holds it now, but an earlier call made it
    assert inside(results, out) and results.take(out) is None


def test_a_private_view_of_a_fresh_array_is_handed_over(results):
    out = results.call(lambda: np.arange(1000.0).reshape(10, 100), ())
    assert results.take(out) is not None


def test_tuple_and_list_results(results):
    a, b = results.call(lambda: (np.ones(1000), np.zeros(1000)), ())
    assert results.take(a) is not None and results.take(b) is not None
    same = np.ones(1000)
    c, d = results.call(lambda: [same * 2] * 2, ())  # one array twice
    assert c is d and results.take(c) is None
    out = results.call(lambda: kept.setdefault("list", [np.ones(1000)]), ())  # kept
    assert results.take(out[0]) is None


# ---------------------------------------------------- block lifetimes --

def test_a_temporary_goes_back_during_the_call(results):
    def function():
        for _ in range(100):
            np.ones(ARENA // 16) * 2  # 64 KiB each, freed at once
        return np.ones(10)
    out = results.call(function, ())
    assert results.live_blocks() == 1 and inside(results, out)


def test_a_sent_block_goes_back_when_both_sides_let_go(results):
    out = results.call(np.ones, (1000,))
    offset, _ = results.take(out)
    del out
    gc.collect()
    assert results.live_blocks() == 1  # the parent still holds it
    results.hand_back(offset)
    assert results.live_blocks() == 0 and results.free_bytes() == ARENA
    out = results.call(np.ones, (1000,))
    offset, _ = results.take(out)
    results.hand_back(offset)  # the parent first, the worker's array after
    assert results.live_blocks() == 1
    del out
    assert results.live_blocks() == 0


def test_a_block_is_handed_back_exactly_once(results):
    out = results.call(np.ones, (1000,))
    offset, _ = results.take(out)
    assert results.take(out) is None  # not twice either
    results.hand_back(offset)
    with pytest.raises(ValueError, match=f"result block {offset} was handed back, but the "
                                         f"parent does not hold it"):
        results.hand_back(offset)
    other = results.call(np.ones, (1000,))  # a live block the parent never got
    with pytest.raises(ValueError, match="does not hold it"):
        results.hand_back(other.ctypes.data - results.address)
    with pytest.raises(ValueError, match="does not hold it"):
        results.hand_back(ARENA * 2)
    assert inside(results, other) and (other == 1).all()


def test_a_reserved_block_for_a_copy(results):
    offset, size = results.reserve(1000)
    assert offset % pw.ALIGN == 0 and size == 1024
    assert results.live_blocks() == 1
    results.hand_back(offset)
    assert results.live_blocks() == 0
    assert results.reserve(ARENA + 1) is None


def test_arrays_freed_on_another_thread_go_back(results):
    arrays = [results.call(np.ones, (1000,)) for _ in range(10)]
    assert results.live_blocks() == 10
    thread = threading.Thread(target=arrays.clear)
    thread.start()
    thread.join()
    assert results.live_blocks() == 0


def test_calloc_zeroes_a_reused_block():
    mapping = mmap.mmap(-1, ARENA)
    mapping.write(b"\xff" * ARENA)  # an earlier call's bytes everywhere
    results = pw.ResultArena(mapping, min_bytes=1)
    zeros = results.call(np.zeros, (1000,))
    assert inside(results, zeros) and not zeros.any()


def test_realloc_keeps_the_data(results):
    def grow():
        a = np.arange(1000.0)
        a.resize(50_000, refcheck=False)  # NumPy reallocates the data
        return a
    out = results.call(grow, ())
    assert inside(results, out)
    assert (out[:1000] == np.arange(1000.0)).all() and not out[1000:].any()
    assert results.live_blocks() == 1

    def grow_past_the_arena():
        a = np.arange(1000.0)
        a.resize(ARENA, refcheck=False)
        return a
    out = results.call(grow_past_the_arena, ())
    assert not inside(results, out) and (out[:1000] == np.arange(1000.0)).all()


def test_arrays_keep_the_mapping_after_the_arena_goes():
    mapping = mmap.mmap(-1, ARENA)
    results = pw.ResultArena(mapping, min_bytes=1)
    out = results.call(np.ones, (1000,))
    with pytest.raises(BufferError):
        mapping.close()  # the handler holds it
    del results
    gc.collect()
    with pytest.raises(BufferError):
        mapping.close()  # the array's handler still holds it
    assert (out == 1).all()
    del out
    gc.collect()
    mapping.close()


def test_the_arena_must_be_aligned_and_writable():
    with pytest.raises(BufferError):
        pw.ResultArena(bytes(4096))
    buffer = np.zeros(4096 + 64, np.uint8)
    start = (-buffer.ctypes.data) % 64 + 1
    with pytest.raises(ValueError, match="must start on a 64-byte boundary"):
        pw.ResultArena(buffer[start:start + 4096])
