"""Process workers: Ctrl-C in a caller waiting on the pool, at any moment
of a call, leaves every block with an owner (scripts in fresh interpreters,
with timeouts)."""
import os
import signal
import subprocess

import pytest

from conftest import ROOT, TESTS, script_env, wait_for
from fresh_python import TIMEOUT, started_python
from process_pool_helpers import HERE, run_script
from process_pool_helpers import failing_start  # noqa: F401 (fixtures)


# Ctrl-C in the waiting caller, again and again, in a fresh interpreter (a
# signal, and a hang to stop by the timeout).  Each interrupted call stays
# with the pool (queued, or in its worker); its blocks must stay its own
# until the worker is done with them: inputs (else the next call's input is
# the block it writes to in place) and results (else they fill the worker's
# result arena).
_INTERRUPTED_SCRIPT = "pool/interrupts_interrupted.py"


# Ctrl-C at any moment of a call: while its inputs are placed, handed to a
# worker, its reply decoded.  Every block must end with an owner: once the
# calls are done, the arena is whole and the values right.
_INTERRUPTED_ANYWHERE_SCRIPT = "pool/interrupts_interrupted_anywhere.py"


# Ctrl-C from outside while the one worker runs a long call: the abandoned
# call's worker is ended and replaced, so that the next call is served now.
_ABANDONED_SCRIPT = "pool/interrupts_abandoned_call_ends.py"


def test_ctrl_c_ends_the_worker_of_the_abandoned_call(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    env = script_env(ROOT, TESTS, HERE, PFB_TEST_MARKS=str(marks))
    with started_python(_ABANDONED_SCRIPT, env=env, text=True, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE) as proc:
        # The state: the worker is inside the 600 s call (or the script ended).
        wait_for(lambda: os.listdir(marks) or proc.poll() is not None, seconds=TIMEOUT)
        os.kill(proc.pid, signal.SIGINT)  # (started_python ends it, by its pid)
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0 and out.strip() == "done", err[-3000:]


def test_ctrl_c_at_any_moment_of_a_call_leaves_every_block_an_owner():
    run_script(_INTERRUPTED_ANYWHERE_SCRIPT)


# Ctrl-C while a call waits for its one worker, which is held, again and
# again: the interrupt lands once the call's input is placed, at any moment
# of its wait, also just before the wait blocks (the wait must look for it
# itself).
_INTERRUPTED_QUEUED_SCRIPT = "pool/interrupts_interrupted_queued.py"


def test_a_call_interrupted_while_queued_leaves_the_queue_with_its_blocks(tmp_path):
    run_script(_INTERRUPTED_QUEUED_SCRIPT, str(tmp_path / "go"))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_ctrl_c_leaves_a_calls_blocks_with_its_worker_until_it_is_done(framework):
    if framework == "torch":
        pytest.importorskip("torch")
    run_script(_INTERRUPTED_SCRIPT, framework)


# Ctrl-C while ProcessPool() waits for its worker's start (here, a start
# slowed until the caller has seen the interrupt, as on a loaded machine):
# the start ends before the constructor raises, and its process with it; no
# process starts later on the interrupted pool's descriptors, which by then
# may be the next pool's.
_INTERRUPTED_START_SCRIPT = "pool/interrupts_interrupted_start.py"


def test_ctrl_c_while_a_pool_starts_leaves_no_process_behind():
    run_script(_INTERRUPTED_START_SCRIPT)


# Ctrl-C while a dropped pool's __del__ closes it: nothing else can finish
# that close, so it is finished there; every memfd of the pool goes.
_INTERRUPTED_DROP_SCRIPT = "pool/interrupts_interrupted_drop.py"


def test_ctrl_c_while_a_dropped_pool_closes_leaves_no_shared_memory():
    run_script(_INTERRUPTED_DROP_SCRIPT)


# A Ctrl-C right after close() closed a descriptor, before it noted that:
# the close that finishes the interrupted one must not close it again (the
# number may be another file's by then), and nothing is left open.
_INTERRUPTED_FD_CLOSE_SCRIPT = "pool/interrupts_interrupted_fd_close.py"


def test_a_close_interrupted_after_closing_a_descriptor_never_closes_it_twice():
    run_script(_INTERRUPTED_FD_CLOSE_SCRIPT)


# Ctrl-C in a call that revives a broken pool (past its back-off), while the
# first of its workers starts: the revival goes on, and every worker starts.
_INTERRUPTED_REVIVAL_SCRIPT = "pool/interrupts_interrupted_revival.py"


def test_ctrl_c_while_a_broken_pool_revives_still_starts_every_worker(failing_start):
    run_script(_INTERRUPTED_REVIVAL_SCRIPT, failing_start)


# close() run on the spawning thread while it starts one of that pool's
# workers (as a finalizer run there would): it cannot wait for that start,
# which is its own thread's, and the start ends (fails) once the pool closed.
_CLOSED_BY_ITS_SPAWNER_SCRIPT = "pool/interrupts_closed_by_its_spawner.py"


def test_close_on_the_spawning_thread_during_a_start_does_not_hang(failing_start):
    run_script(_CLOSED_BY_ITS_SPAWNER_SCRIPT, failing_start)


STUCK_WAIT_LOCK = "pool/interrupts_stuck_wait_lock.py"


def test_a_close_reaps_workers_whose_wait_lock_an_interrupt_left_held():
    """The Ctrl-C test above hung once in Popen.wait(): an interrupt had left
    the process's wait lock held.  Workers are reaped with os.waitpid."""
    run_script(STUCK_WAIT_LOCK)
