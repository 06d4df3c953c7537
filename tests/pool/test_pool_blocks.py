"""The one check of a result block a worker names (pfb_pool_block_holds,
src/pool/records.h), as the Python path applies it before it makes an array
over the block (worker_result, src/conversion/process.pxi); the kernel's
native path (pool_route.cc, Fits) calls the same C function."""
import numpy as np
import pytest

from pyfunc_bridge import _library

ARENA = 4096


@pytest.mark.parametrize("offset, size, shape", [
    (64, 64, (16,)),        # exactly its bytes
    (ARENA - 64, 64, (8,)),  # the last block
    (0, 128, (2, 4)),
], ids=str)
def test_a_block_inside_the_arena_is_viewed(offset, size, shape):
    results = np.zeros(ARENA, np.uint8)
    results[offset:offset + 4] = [0, 0, 0x80, 0x3f]  # 1.0f
    view = _library.conversion().worker_result(None, results, offset, size, np.float32, shape)
    assert view.shape == shape and view.reshape(-1)[0] == 1.0
    assert not view.flags.writeable
    assert np.shares_memory(view, results)


@pytest.mark.parametrize("offset, size, shape", [
    (1, 64, (16,)),               # not aligned
    (64, 32, (16,)),              # smaller than its values
    (ARENA - 64, 128, (16,)),     # past the arena's end
    (ARENA + 64, 64, (16,)),      # past it altogether
    (-64, 64, (16,)),             # before it
    (64, 2 ** 62, (16,)),         # a size that would wrap an end offset
], ids=str)
def test_a_block_outside_the_arena_is_refused(offset, size, shape):
    results = np.zeros(ARENA, np.uint8)
    with pytest.raises(RuntimeError, match="described a result block"):
        _library.conversion().worker_result(None, results, offset, size, np.float32, shape)
