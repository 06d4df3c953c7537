"""Process workers: Ctrl-C in a caller waiting on the pool, at any moment
of a call, leaves every block with an owner (scripts in fresh interpreters,
with timeouts)."""
import pytest

from process_pool_helpers import run_script
from process_pool_helpers import failing_start  # noqa: F401 (fixtures)


# Ctrl-C in the waiting caller, again and again, in a fresh interpreter (a
# signal, and a hang to stop by the timeout).  Each interrupted call stays
# with the pool (queued, or in its worker); its blocks must stay its own
# until the worker is done with them: inputs (else the next call's input is
# the block it writes to in place) and results (else they fill the worker's
# result arena).
_INTERRUPTED_SCRIPT = r"""
import signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import in_arena, settled
FRAMEWORK = {framework!r}
BLOCK = 4 << 20  # one 1 Mi-element float32 input or result
main = threading.main_thread()

def call(value):
    x = tf.fill([1 << 20], float(value))
    if FRAMEWORK == "numpy":
        return pfb.numpy_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                                  executor=pool)
    return pfb.array_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                              framework=FRAMEWORK, executor=pool)

def waiting():  # the main thread waits in the pool (its innermost Python frame)
    frame = sys._current_frames().get(main.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"

def interrupt(moment, gate, returned):
    # SIGINT to the main thread at a moment of the call (a state it reaches,
    # never a time, which a loaded machine stretches): at once (its inputs
    # being made), or once it waits for its worker; never once it returned.
    ready = (lambda: True) if moment == "at once" else waiting
    while True:
        with gate:
            if returned:
                return
            if ready():
                signal.pthread_kill(main.ident, signal.SIGINT)
                return
        time.sleep(0.001)

with pfb.ProcessPool(1, arena_bytes=4 * BLOCK, name="interrupted pool") as pool:
    interrupted, most_held = 0, 0
    for i in range(12):
        gate, returned = threading.Lock(), []
        interrupter = threading.Thread(target=interrupt, args=(
            ("at once", "waiting", "waiting")[i % 3], gate, returned))
        try:
            interrupter.start()
            call(100 + i)
            with gate:  # (a SIGINT sent before this lands inside the try)
                returned.append(True)
        except KeyboardInterrupt:
            interrupted += 1
        interrupter.join()
        # The blocks of the calls still with the pool are theirs.
        most_held = max(most_held, pool.arena_bytes - pool.free_input_bytes)
    # (A KeyboardInterrupt raised in a gc callback is ignored: the call runs on.)
    # A call interrupted while its worker is busy keeps its input block
    # until the worker is done with it.
    assert interrupted >= 8 and most_held >= BLOCK, (interrupted, most_held)
    # The next calls run after the abandoned ones, which wrote in place to
    # their own blocks, not to these calls' inputs.
    for value in (10, 11, 12):
        out = call(value)
        np.testing.assert_array_equal(out.numpy(), np.full(1 << 20, 2.0 * value))
    # The abandoned calls' results went back to the worker: its arena still
    # has room for a 4 MiB result, which comes back through shared memory
    # (without copy=True, which copies every result).
    out = pfb.numpy_function(pf.identity, [tf.fill([1 << 20], 1.0)], tf.float32,
                             executor=pool)
    assert in_arena(pool, out)
    settled(pool)
print("done")
"""


# Ctrl-C at any moment of a call: while its inputs are placed, handed to a
# worker, its reply decoded.  Every block must end with an owner: once the
# calls are done, the arena is whole and the values right.
_INTERRUPTED_ANYWHERE_SCRIPT = r"""
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import Interrupts, settled
with pfb.ProcessPool(2, arena_bytes=1 << 20, name="interrupted pool") as pool:
    x = tf.fill([64 << 10], 3.0)  # 256 KiB: four fit the arena
    interrupts = Interrupts(seed=18)
    interrupted = calls = 0
    while calls < 300:
        try:
            calls += 1
            out = interrupts.during(pfb.numpy_function, pf.briefly_double_in_place,
                                    [x, x][:1 + calls % 2], tf.float32, copy=True, executor=pool)
            assert float(out[0]) == 6.0 * (1 + calls % 2), (calls, out)
        except KeyboardInterrupt:
            interrupted += 1
    interrupts.stop()
    assert interrupted > 100, interrupted
    settled(pool)  # the state every call leaves in the end, or the script's timeout
    for _ in range(8):
        out = pfb.numpy_function(pf.briefly_double_in_place, [x], tf.float32, copy=True,
                                 executor=pool)
        np.testing.assert_array_equal(out.numpy(), np.full(64 << 10, 6.0))
print("done")
"""


def test_ctrl_c_at_any_moment_of_a_call_leaves_every_block_an_owner():
    run_script(_INTERRUPTED_ANYWHERE_SCRIPT)


# Ctrl-C while a call waits for its one worker, which is held, again and
# again: the interrupt lands once the call's input is placed, at any moment
# of its wait, also just before the wait blocks (the wait must look for it
# itself).
_INTERRUPTED_QUEUED_SCRIPT = r"""
import os, signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
main = threading.main_thread().ident
BLOCK = 4000  # the waiting call's input: 1000 float32, in one block
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="queued pool") as pool:
    for round in range(12):
        go = f"{sys.argv[1]}-{round}"
        holder = threading.Thread(target=pfb.numpy_function,
                                  args=(pf.wait_for_file, [tf.constant(go)], tf.int64),
                                  kwargs={"executor": pool})
        holder.start()
        while pool.free_input_bytes == pool.arena_bytes:  # the holder's input is placed
            time.sleep(0.01)
        held = pool.free_input_bytes
        def interrupt_once_queued():
            while pool.free_input_bytes > held - BLOCK:  # the call's input is placed
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)
        interrupter = threading.Thread(target=interrupt_once_queued)
        interrupter.start()
        try:
            pfb.numpy_function(pf.double, [tf.fill([1000], 1.0)], tf.float32, executor=pool)
            raise AssertionError("not interrupted")
        except KeyboardInterrupt:
            pass
        interrupter.join()
        open(go, "w").close()
        holder.join()
        # The abandoned call's input block went back (at once, or once its
        # worker ran it), and its result's too: nothing is held for good.
        while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
            time.sleep(0.01)
    out = pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32, executor=pool)
    np.testing.assert_array_equal(out.numpy(), np.full(1000, 4.0))
print("done")
"""


def test_a_call_interrupted_while_queued_leaves_the_queue_with_its_blocks(tmp_path):
    run_script(_INTERRUPTED_QUEUED_SCRIPT, str(tmp_path / "go"))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_ctrl_c_leaves_a_calls_blocks_with_its_worker_until_it_is_done(framework):
    if framework == "torch":
        pytest.importorskip("torch")
    run_script(_INTERRUPTED_SCRIPT.format(framework=framework))


# Ctrl-C while ProcessPool() waits for its worker's start (here, a start
# slowed until the caller has seen the interrupt, as on a loaded machine):
# the start ends before the constructor raises, and its process with it; no
# process starts later on the interrupted pool's descriptors, which by then
# may be the next pool's.
_INTERRUPTED_START_SCRIPT = r"""
import os, signal, subprocess, threading
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
main = threading.main_thread().ident
interrupted, raised = threading.Event(), threading.Event()
started = []  # (process, whether ProcessPool() had raised when it started)

def on_sigint(*_):
    interrupted.set()
    raise KeyboardInterrupt

real_popen = subprocess.Popen
class SlowStart(real_popen):
    def __init__(self, args, **kwargs):
        if not started:  # the first start: Ctrl-C in its caller, then the start goes on
            signal.pthread_kill(main, signal.SIGINT)
            interrupted.wait(60)
            raised.wait(2)  # (a start still under way when the constructor raised)
        super().__init__(args, **kwargs)
        started.append((self, raised.is_set()))

signal.signal(signal.SIGINT, on_sigint)
subprocess.Popen = SlowStart
try:
    pfb.ProcessPool(1, name="interrupted start", timeout=30)
    raise AssertionError("not interrupted")
except KeyboardInterrupt:
    raised.set()
assert all(process.poll() is not None for process, _ in started), "a process of it runs"
signal.signal(signal.SIGINT, signal.default_int_handler)
with pfb.ProcessPool(1, name="next pool") as pool:
    served = {int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))
              for _ in range(10)}
    assert served == set(pool.pids()), (served, pool.pids())
    interrupted_pools = [process for process, _ in started if process.pid not in pool.pids()]
assert not [process.pid for process, late in started
            if late and process in interrupted_pools], "started after it raised"
assert all(process.poll() is not None for process in interrupted_pools)
print("done")
"""


def test_ctrl_c_while_a_pool_starts_leaves_no_process_behind():
    run_script(_INTERRUPTED_START_SCRIPT)


# Ctrl-C while a dropped pool's __del__ closes it: nothing else can finish
# that close, so it is finished there; every memfd of the pool goes.
_INTERRUPTED_DROP_SCRIPT = r"""
import gc, signal, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import memfds_of
armed = False

def on_alarm(*_):
    global armed
    if armed:  # once, and only inside the try below
        armed = False
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, on_alarm)
for step in range(25):
    pool = pfb.ProcessPool(1, arena_bytes=4096, name="dropped while interrupted")
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)  # its worker serves
    try:
        armed = True
        signal.setitimer(signal.ITIMER_REAL, 0.0005 + step * 0.001)
        del pool  # __del__ closes it
        time.sleep(0.1)
        armed = False
    except KeyboardInterrupt:
        pass
gc.collect()
assert memfds_of("dropped while interrupted") == ([], []), memfds_of("dropped while interrupted")
print("done")
"""


def test_ctrl_c_while_a_dropped_pool_closes_leaves_no_shared_memory():
    run_script(_INTERRUPTED_DROP_SCRIPT)


# A Ctrl-C right after close() closed a descriptor, before it noted that:
# the close that finishes the interrupted one must not close it again (the
# number may be another file's by then), and nothing is left open.
_INTERRUPTED_FD_CLOSE_SCRIPT = r"""
import os, sys
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import memfds_of
real_close = os.close
for where in ("_close_channel", "_close_input_fd"):
    name = f"interrupted in {where}"
    pool = pfb.ProcessPool(1, name=name)
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
    armed = [True]

    def close(fd):
        real_close(fd)
        if armed[0] and sys._getframe(1).f_code.co_name == where:
            armed[0] = False
            raise KeyboardInterrupt

    os.close = close
    try:
        pool.close()
    except KeyboardInterrupt:
        pass
    os.close = real_close
    assert not armed[0], where  # the interrupt came where it was meant to
    pool.close()
    assert memfds_of(name) == ([], []), (where, memfds_of(name))
print("done")
"""


def test_a_close_interrupted_after_closing_a_descriptor_never_closes_it_twice():
    run_script(_INTERRUPTED_FD_CLOSE_SCRIPT)


# Ctrl-C in a call that revives a broken pool (past its back-off), while the
# first of its workers starts: the revival goes on, and every worker starts.
_INTERRUPTED_REVIVAL_SCRIPT = r"""
import signal, subprocess, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool.supervision import Supervisor
from pool_checks import broken_pool
Supervisor.retry_seconds = 0.2  # the back-off this script waits out
main = threading.main_thread().ident
pool = broken_pool(2, "revived pool", sys.argv[1])

def call():
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))

interrupted, starts = threading.Event(), []

def on_sigint(*_):
    interrupted.set()
    raise KeyboardInterrupt

real_popen = subprocess.Popen
class InterruptedStart(real_popen):
    def __init__(self, args, **kwargs):
        if not starts:  # the revival's first start: Ctrl-C in the call that waits for it
            starts.append(True)
            signal.pthread_kill(main, signal.SIGINT)
            interrupted.wait(60)
        super().__init__(args, **kwargs)

signal.signal(signal.SIGINT, on_sigint)
subprocess.Popen = InterruptedStart
while True:
    try:
        call()
        raise AssertionError("served before it was revived")
    except tf.errors.UnknownError:
        time.sleep(0.05)  # still broken: the back-off runs
    except KeyboardInterrupt:
        break
signal.signal(signal.SIGINT, signal.default_int_handler)
deadline = time.monotonic() + 60
while len(pool.pids()) < 2:  # the state: both workers started
    assert time.monotonic() < deadline, f"the revival started {pool.pids()}"
    time.sleep(0.01)
assert call() in pool.pids()
pool.close()
print("done")
"""


def test_ctrl_c_while_a_broken_pool_revives_still_starts_every_worker(failing_start):
    run_script(_INTERRUPTED_REVIVAL_SCRIPT, failing_start)


# close() run on the spawning thread while it starts one of that pool's
# workers (as a finalizer run there would): it cannot wait for that start,
# which is its own thread's, and the start ends (fails) once the pool closed.
_CLOSED_BY_ITS_SPAWNER_SCRIPT = r"""
import os, subprocess, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool.supervision import Supervisor
from pool_checks import broken_pool
Supervisor.retry_seconds = 0.2
pool = broken_pool(1, "self-ending pool", sys.argv[1])

def call():
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool))

real_popen = subprocess.Popen
class ClosingStart(real_popen):
    def __init__(self, args, **kwargs):
        pool.close()  # on the spawning thread, in the middle of the revival's start
        super().__init__(args, **kwargs)
subprocess.Popen = ClosingStart
outcome = []

def calls():
    while True:
        try:
            call()
        except (tf.errors.UnknownError, tf.errors.FailedPreconditionError) as error:
            if "was closed" in str(error) or "is closed" in str(error):
                outcome.append(str(error))
                return
            time.sleep(0.05)  # still broken: the back-off runs

caller = threading.Thread(target=calls, daemon=True)
caller.start()
caller.join(60)
if not outcome:  # (the spawning thread waits for itself: so would the exit)
    sys.stderr.write("the call that revived the pool never returned\n")
    sys.stderr.flush()
    os._exit(1)
assert pool.closed and pool.pids() == [], pool.pids()
print("done")
"""


def test_close_on_the_spawning_thread_during_a_start_does_not_hang(failing_start):
    run_script(_CLOSED_BY_ITS_SPAWNER_SCRIPT, failing_start)


STUCK_WAIT_LOCK = """
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
pool = pfb.ProcessPool(2, name="stuck wait lock")
pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
# What a KeyboardInterrupt between Popen.wait's acquire and its try leaves:
# the process's wait lock held for good.
workers = list(pool._supervisor.workers)
assert len(workers) == 2
for worker in workers:
    worker.proc._waitpid_lock.acquire()
pool.close()  # kills and reaps the workers without Popen.wait
assert all(w.proc.returncode is not None for w in workers)
print("done")
"""


def test_a_close_reaps_workers_whose_wait_lock_an_interrupt_left_held():
    """The Ctrl-C test above hung once in Popen.wait(): an interrupt had left
    the process's wait lock held.  Workers are reaped with os.waitpid."""
    run_script(STUCK_WAIT_LOCK)
