"""The pool's arena allocator (src/pool/arena.c, through the one Python face
it has, a worker's ResultArena: ``reserve`` allocates a block, ``hand_back``
frees it): alignment, exhaustion, coalescing, refused hand-backs, and a
random sequence checked against a model."""
import mmap
import os
import random
import re

import pytest

from pyfunc_bridge import _pool as pw

ALIGN = pw.ALIGN


class Arena:
    """An arena of `size` bytes (its own anonymous mapping) with the
    allocator's calls by their names."""

    def __init__(self, size):
        self.results = pw.ResultArena(memoryview(mmap.mmap(-1, max(size, 1)))[:size])
        self.size = self.results.size
        self.alloc = self.results.reserve
        self.free = self.results.hand_back
        self.free_bytes = self.results.free_bytes
        self.live_blocks = self.results.live_blocks


def test_alignment_is_the_tensor_alignment():
    """shm_layout.h restates bridge_abi.h's alignment (the worker's module
    does not see bridge_abi.h): the two must agree, and the module's with them."""
    from conftest import ROOT
    src = os.path.join(ROOT, "src")

    def define(header, name):
        with open(os.path.join(src, header)) as f:
            return int(re.search(rf"#define {name} (\d+)", f.read()).group(1))
    assert define("bridge_abi.h", "PFB_TENSOR_ALIGNMENT") == define(
        "pool/shm_layout.h", "PFB_POOL_ALIGN") == ALIGN


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 65, 127, 128, 1000, 4096, 4097])
def test_blocks_are_aligned_and_rounded_up(nbytes):
    arena = Arena(1 << 16)
    first = arena.alloc(1)  # so the block under test does not start at 0
    offset, size = arena.alloc(nbytes)
    assert offset % ALIGN == 0 and size % ALIGN == 0
    assert size >= max(nbytes, 1) and size - max(nbytes, 1) < ALIGN
    assert offset >= first[0] + first[1]
    assert arena.free_bytes() == arena.size - first[1] - size


def test_size_rounds_down_to_the_alignment():
    assert Arena(1000).size == 960
    assert Arena(63).alloc(1) is None  # no whole block
    assert Arena(0).alloc(0) is None


def test_exhaustion_and_reuse():
    arena = Arena(10 * ALIGN)
    blocks = [arena.alloc(ALIGN) for _ in range(10)]
    assert [b[0] for b in blocks] == [i * ALIGN for i in range(10)]
    assert arena.alloc(1) is None and arena.free_bytes() == 0
    arena.free(3 * ALIGN)
    assert arena.alloc(2 * ALIGN) is None  # one block's room only
    assert arena.alloc(1) == (3 * ALIGN, ALIGN)  # first fit: the freed block
    assert arena.alloc(11 * ALIGN) is None  # larger than the arena


def test_freed_neighbours_coalesce():
    arena = Arena(8 * ALIGN)
    a, b, c, d = (arena.alloc(2 * ALIGN)[0] for _ in range(4))
    arena.free(a)
    arena.free(c)
    assert arena.free_bytes() == 4 * ALIGN and arena.alloc(3 * ALIGN) is None  # two ranges
    arena.free(b)  # joins both neighbours
    assert arena.alloc(6 * ALIGN) == (0, 6 * ALIGN)
    arena.free(0)
    arena.free(d)  # joins the range before it
    assert arena.free_bytes() == arena.size
    assert arena.alloc(8 * ALIGN) == (0, 8 * ALIGN)


def test_a_block_that_is_not_live_is_refused_and_nothing_changes():
    arena = Arena(8 * ALIGN)
    offset, _ = arena.alloc(2 * ALIGN)
    for bad in (offset + ALIGN, 7 * ALIGN, 1 << 40, 2**64 - 1):
        with pytest.raises(ValueError, match=f"result block {bad} was handed back, but"):
            arena.free(bad)
    arena.free(offset)
    with pytest.raises(ValueError, match="does not hold it"):  # twice
        arena.free(offset)
    assert arena.free_bytes() == arena.size and arena.alloc(arena.size) == (0, arena.size)


def test_random_sequence_matches_a_model():
    """Thousands of allocs and frees: blocks never overlap, stay in bounds,
    the free count is exact, and an empty arena is one range again."""
    rng = random.Random(19)
    arena = Arena(1 << 20)
    live = {}
    for _ in range(5000):
        if live and rng.random() < 0.45:
            offset = rng.choice(list(live))
            arena.free(offset)
            del live[offset]
        else:
            got = arena.alloc(rng.choice([1, 64, 100, 1000, 5000, 40_000, 200_000]))
            if got is None:
                continue
            offset, size = got
            assert offset % ALIGN == 0 and offset + size <= arena.size
            assert offset not in live
            live[offset] = size
        spans = sorted(live.items())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert arena.free_bytes() == arena.size - sum(live.values())
        assert arena.live_blocks() == len(live)
    for offset in list(live):
        arena.free(offset)
    assert arena.alloc(arena.size) == (0, arena.size)  # one range again
