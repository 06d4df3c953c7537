"""Process workers at exit: a normal exit, an unhandled exception, the
default pool at interpreter exit and a killed parent leave no worker and no
shared memory (subprocesses with timeouts, checked in /proc and /dev/shm)."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import ROOT, TESTS, script_env, wait_for
from fresh_python import fresh_python, started_python
from pool_checks import worker_alive
import pyfunc_bridge as pfb


# A program that uses a pool, then ends as its argument says.
_EXIT_SCRIPT = "pool/exit_exits.py"


def _shm():
    """/dev/shm's names, less multiprocessing's semaphores (``sem.mp-*``): the
    pool makes none, and other programs on a shared machine do meanwhile."""
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {n for n in names if not n.startswith("sem.mp-")}


@pytest.mark.parametrize("how, code", [("normal", 0), ("unhandled", 1),
                                       ("default", 0), ("default in flight", 0)])
def test_exit_leaves_no_worker_and_no_shared_memory(tmp_path, how, code):
    before = _shm()
    run = fresh_python(_EXIT_SCRIPT, how, cwd=ROOT, timeout=120)
    assert run.returncode == code, run.stderr[-3000:]
    pids = json.loads(run.stdout.splitlines()[0])
    assert len(pids) >= 1
    assert not [p for p in pids if worker_alive(p)]
    assert _shm() - before == set()
    if how == "unhandled":
        assert "unhandled in the main program" in run.stderr
    else:
        assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_workers_end_when_their_parent_is_killed(tmp_path):
    with started_python(_EXIT_SCRIPT, "killed", cwd=ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True) as proc:
        pids = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
        assert all(worker_alive(p) for p in pids)
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not [p for p in pids if worker_alive(p)], seconds=20)


# Two workers stuck in functions (one asleep, one looping in Python), then
# the parent dies as the test says: killed (by the test) or os._exit.
_BUSY_PARENT_SCRIPT = "pool/exit_busy_parent.py"


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "exit"])
def test_busy_workers_end_within_seconds_when_their_parent_dies(tmp_path, how):
    """A worker inside a function (asleep, or holding its GIL) cannot read the
    end of its socket: it dies with its parent all the same (PR_SET_PDEATHSIG)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    pids = []
    try:
        with started_python(_BUSY_PARENT_SCRIPT, how, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=script_env(ROOT, TESTS, PFB_TEST_MARKS=str(marks))) as proc:
            pids = json.loads(proc.stdout.readline())
            assert len(pids) == 2 and all(worker_alive(p) for p in pids)
            if how == "exit":
                proc.stdin.write("exit now\n")
                proc.stdin.flush()
            else:
                proc.send_signal(getattr(signal, how))
            proc.wait(timeout=30)
            wait_for(lambda: not [p for p in pids if worker_alive(p)], seconds=2)
    finally:
        for p in pids:  # what outlived the parent (the failure this tests)
            if worker_alive(p):
                os.kill(p, signal.SIGKILL)


def test_workers_outlive_the_thread_that_started_them():
    """The kernel's death signal follows the thread that started a worker:
    workers started by a thread that ends (a tf.data thread, the reader
    thread that replaces a dead worker) live on."""
    box = {}

    def start():
        box["pool"] = pfb.ProcessPool(1)
        # A call: the worker has asked for its death signal before this thread ends.
        box["pid"] = int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                            executor=box["pool"]))
    starter = threading.Thread(target=start)
    starter.start()
    starter.join(timeout=60)
    with box["pool"] as pool:
        first = pool.pids()
        assert first == [box["pid"]]
        time.sleep(0.5)  # a death signal would have killed the worker by now
        assert pool.pids() == first and worker_alive(first[0])
        os.kill(first[0], signal.SIGKILL)  # its reader thread starts the next one, and ends
        wait_for(lambda: pool.pids() and pool.pids() != first)
        time.sleep(0.5)
        assert int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64,
                                      executor=pool)) == pool.pids()[0]
