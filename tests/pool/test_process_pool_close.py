"""ProcessPool.close() and what may not share a pool: an interrupted close
is finished by the next one, and a copy of a pool is refused.  The Ctrl-C
case runs in a subprocess (its pool's workers must end with it)."""
import copy

import pytest

from conftest import ROOT, TESTS, script_env
from fresh_python import fresh_python

import pyfunc_bridge as pfb

# close() is interrupted (SIGINT, as Ctrl-C) while it waits for a worker that
# is stuck in a call; the next close() must end that worker and let go of the
# pool's memfds.
_INTERRUPTED_CLOSE_SCRIPT = "pool/close_interrupted_close.py"


def test_a_close_interrupted_by_ctrl_c_is_finished_by_the_next_close(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    run = fresh_python(_INTERRUPTED_CLOSE_SCRIPT, marks, timeout=300,
                       env=script_env(ROOT, TESTS, PFB_TEST_MARKS=str(marks)))
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-3000:]


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy])
def test_a_pool_cannot_be_copied_and_stays_usable(copier):
    with pfb.ProcessPool(1, arena_bytes=1 << 16, name="copied pool") as pool:
        with pytest.raises(TypeError, match=r"cannot be copied .* share its worker processes "
                                            r"and shared memory.*pass the pool itself"):
            copier(pool)
        assert len(pool.pids()) == 1
    assert pool.closed  # (a copy that shared its descriptors made this close fail: EBADF)


def test_free_input_bytes_shows_the_input_arena_held_and_is_0_once_closed():
    import tensorflow as tf
    import process_functions as pf
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name="free bytes pool") as pool:
        assert pool.free_input_bytes == pool.arena_bytes
        keep = pf.keeper()  # keeps its inputs' blocks until it is forgotten
        pfb.numpy_function(keep, [tf.range(1000.0)], tf.float32, executor=pool)
        assert 0 < pool.free_input_bytes <= pool.arena_bytes - 4000
    assert pool.free_input_bytes == 0
