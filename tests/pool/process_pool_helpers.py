"""What the test_process_pool_*.py files share: their common pool, scripts
in fresh interpreters, calls from a thread, and this process's sockets.
The /proc probes that scripts share too are in tests/pool_checks.py."""
import os
import threading
import time

import pytest
import tensorflow as tf

from conftest import ROOT, TESTS, script_env, wait_for
from fresh_python import fresh_python
import pyfunc_bridge as pfb

# This file's folder, on the PYTHONPATH of the scripts run_script starts.
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def pool():
    """One pool for the tests that leave it as they found it (starting one
    costs about half a second)."""
    with pfb.ProcessPool(2, name="test pool") as shared:
        yield shared


@pytest.fixture
def marks(tmp_path, monkeypatch):
    """The folder where pf.hang and pf.spin leave their worker's pid as they
    start (PFB_TEST_MARKS, which the workers inherit)."""
    folder = tmp_path / "marks"
    folder.mkdir()
    monkeypatch.setenv("PFB_TEST_MARKS", str(folder))
    return folder


def marked_pid(marks):
    """The pid of the one worker that has entered a marking function."""
    wait_for(lambda: len(os.listdir(marks)) == 1, seconds=30)
    return int(os.listdir(marks)[0])


def run_script(script, *args, **extra_env):
    """Runs `script` (tests/scripts/pool/...) in a fresh interpreter, with
    this folder on its path too (a hang there fails the test by its
    timeout); it prints "done" at its end."""
    run = fresh_python(script, *args, env=script_env(ROOT, TESTS, HERE, **extra_env))
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-3000:]


def apply_function(func, inputs, tout, framework, executor, copy=None):
    """numpy_function, or array_function for a framework other than NumPy."""
    if framework == "numpy":
        return pfb.numpy_function(func, inputs, tout, executor=executor, copy=copy)
    pytest.importorskip(framework)
    return pfb.array_function(func, inputs, tout, framework=framework, executor=executor,
                              copy=copy)


def arena_settled(pool, expected=None):
    """Free bytes of the input arena once, within a few seconds, they are
    `expected` (the callers' calls have returned): blocks that come back in
    a ring's INPUTS_BACK are freed by the dispatcher's reply thread, which
    may run a moment after the call that let go of them returned."""
    deadline = time.monotonic() + 5
    while True:
        free = pool.free_input_bytes
        if expected in (None, free) or time.monotonic() > deadline:
            return free
        time.sleep(0.01)


def call_in_thread(func, value, executor):
    box = {}

    def call():
        try:
            box["result"] = pfb.numpy_function(func, [tf.constant(value)], tf.int64,
                                               executor=executor)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc
    thread = threading.Thread(target=call)
    thread.start()
    return thread, box


def open_sockets():
    """This process's open socket descriptors."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.add(fd)
        except OSError:
            continue  # the descriptor listdir itself used
    return found


@pytest.fixture
def failing_start(tmp_path):
    """A worker script that exits at once (pool_checks.broken_pool's)."""
    failing = tmp_path / "fails_at_start.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    return str(failing)
