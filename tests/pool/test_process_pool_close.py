"""ProcessPool.close() and what may not share a pool: an interrupted close
is finished by the next one, and a copy of a pool is refused.  The Ctrl-C
case runs in a subprocess (its pool's workers must end with it)."""
import copy
import subprocess
import sys

import pytest

from conftest import ROOT, TESTS, script_env

import pyfunc_bridge as pfb

# close() is interrupted (SIGINT, as Ctrl-C) while it waits for a worker that
# is stuck in a call; the next close() must end that worker and let go of the
# pool's memfds.
_INTERRUPTED_CLOSE_SCRIPT = r"""
import gc, os, signal, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

marks = sys.argv[1]
pool = pfb.ProcessPool(1, name="interrupted pool")
(pid,) = pool.pids()

def stuck_call():
    try:
        pfb.numpy_function(pf.hang, [tf.constant(600.0)], tf.int64, executor=pool)
    except Exception:
        pass  # (the pool's close fails it)

threading.Thread(target=stuck_call, daemon=True).start()
while not os.path.exists(os.path.join(marks, str(pid))):  # the worker is in the call
    time.sleep(0.01)

def interrupt_once_closing():
    while not pool.closed:  # close() has begun: it now waits for the stuck worker
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_closing, daemon=True).start()
try:
    pool.close()
except KeyboardInterrupt:
    pass
else:
    raise AssertionError("close() ended before the SIGINT came (it kills a stuck "
                         "worker after a grace period): the test did not interrupt it")
pool.close()  # finishes what the interrupted close began

def alive(p):
    try:
        os.kill(p, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for this test's purpose (its parent has not reaped it)
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

assert not alive(pid), f"worker {pid} still runs after the second close()"
assert pool.closed and pool.pids() == []
gc.collect()
fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
       if os.path.exists(f"/proc/self/fd/{fd}")]
assert not [t for t in fds if t.startswith("/memfd:interrupted pool")], fds
with open("/proc/self/maps") as f:
    maps = [line for line in f if "/memfd:interrupted pool" in line]
assert not maps, maps
print("done")
"""


def test_a_close_interrupted_by_ctrl_c_is_finished_by_the_next_close(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_CLOSE_SCRIPT, str(marks)], cwd=TESTS,
        capture_output=True, text=True, timeout=300,
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
