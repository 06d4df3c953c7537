"""Process workers at exit: a normal exit, an unhandled exception, the
default pool at interpreter exit and a killed parent leave no worker and no
shared memory (subprocesses with timeouts, checked in /proc and /dev/shm)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import ROOT, TESTS, script_env, wait_for
from pool_checks import worker_alive
import pyfunc_bridge as pfb


_EXIT_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile, threading, time
    sys.path.insert(0, {tests!r})
    folder = tempfile.TemporaryDirectory()  # (removed at exit)
    marks = os.environ["PFB_TEST_MARKS"] = folder.name  # the workers inherit it
    import tensorflow as tf
    import pyfunc_bridge as pfb
    import process_functions as pf
    how = sys.argv[1]
    executor = "process" if how.startswith("default") else pfb.ProcessPool(2)
    pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=executor)
    from pyfunc_bridge.pool import process_pool as _process
    pool = _process.default_pool() if executor == "process" else executor
    print(json.dumps(pool.pids()), flush=True)
    if how == "default in flight":
        for _ in range(2):  # calls that still wait at exit
            threading.Thread(target=pfb.numpy_function, daemon=True,
                             args=(pf.hang, [tf.constant(60.0)], tf.int64),
                             kwargs={{"executor": "process"}}).start()
        while len(os.listdir(marks)) < min(2, len(pool.pids())):  # in their workers
            time.sleep(0.01)
    if how == "unhandled":
        raise RuntimeError("unhandled in the main program")
    if how == "killed":
        print("ready", flush=True)
        time.sleep(60)
""")


def _shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("how, code", [("normal", 0), ("unhandled", 1),
                                       ("default", 0), ("default in flight", 0)])
def test_exit_leaves_no_worker_and_no_shared_memory(tmp_path, how, code):
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_SCRIPT.format(tests=TESTS))
    before = _shm()
    run = subprocess.run([sys.executable, str(script), how], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
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
    script = tmp_path / "killed.py"
    script.write_text(_EXIT_SCRIPT.format(tests=TESTS))
    proc = subprocess.Popen([sys.executable, str(script), "killed"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
        assert all(worker_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not [p for p in pids if worker_alive(p)], seconds=20)


# Two workers stuck in functions (one asleep, one looping in Python), then
# the parent dies as the test says: killed (by the test) or os._exit.
_BUSY_PARENT_SCRIPT = r"""
import json, os, sys, threading, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
pool = pfb.ProcessPool(2)
for func in (pf.hang, pf.spin):
    threading.Thread(target=pfb.numpy_function, daemon=True,
                     args=(func, [tf.constant(600.0)], tf.int64),
                     kwargs={"executor": pool}).start()
marks = os.environ["PFB_TEST_MARKS"]
while len(os.listdir(marks)) < 2:  # both workers are inside their functions
    time.sleep(0.01)
print(json.dumps(pool.pids()), flush=True)
if sys.argv[1] == "exit":
    sys.stdin.readline()  # the test has seen the workers alive
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "exit"])
def test_busy_workers_end_within_seconds_when_their_parent_dies(tmp_path, how):
    """A worker inside a function (asleep, or holding its GIL) cannot read the
    end of its socket: it dies with its parent all the same (PR_SET_PDEATHSIG)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BUSY_PARENT_SCRIPT, how], cwd=TESTS,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=script_env(ROOT, TESTS, PFB_TEST_MARKS=str(marks)))
    pids = []
    try:
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
        proc.kill()
        proc.wait(timeout=30)
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
