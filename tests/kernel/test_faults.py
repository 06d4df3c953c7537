"""Fault tests: interpreter exit in the middle of bridge work, and exits from
inside the function.  Each scenario is a small program that runs 20 times,
each time in a fresh process, and must end with its expected exit status and
nothing on stderr: no abort, no "Exception ignored", no log line.

TensorFlow is not fork-safe once it has run (its eager context, thread pools
and devices), so processes that use it are started with spawn or forkserver.
These runs use the forkserver pattern: one runner process, itself started
fresh, only imports NumPy, TensorFlow, pyfunc_bridge (and torch) and forks
every run from there, a few at a time, so that 20 runs of each scenario cost
a fraction of 20 TensorFlow imports.  Before it forks, the runner checks that
the imports ran no TensorFlow: TF's eager context is not created, and no
thread has started since NumPy's import (OpenBLAS's pool, which NumPy starts
and which handles fork itself).  Each child then starts TensorFlow itself and
exits the normal way: its program ends, or raises, and the interpreter
finalizes.
"""
import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import textwrap

import pytest

from conftest import ROOT
from fresh_python import started_python

# PFB_FAULT_RUNS raises it for a soak run (the 200 exits under load).
RUNS = int(os.environ.get("PFB_FAULT_RUNS", "20"))
PARALLEL = max(2, min(4, os.cpu_count() or 2))

# Scenario name -> (program, expected exit status, expected stderr).
SCENARIOS = {}


def scenario(name, status=0, stderr=""):
    def register(program):
        SCENARIOS[name] = (textwrap.dedent(program), status, stderr)
    return register


scenario("live_zero_copy_tensors")("""
    import numpy as np, tensorflow as tf, pyfunc_bridge as pfb

    def address(t):
        return np.asarray(t).__array_interface__["data"][0]

    made = []

    def fresh(a):
        out = a * 2
        made.append(out.__array_interface__["data"][0])
        return out

    @tf.function
    def f(x):
        return pfb.numpy_function(fresh, [x], tf.float32)

    # Tensors over NumPy memory (graph and eager calls), read-only views of
    # them, and py_function results, all alive at exit.
    kept = [f(tf.ones([1000])) for _ in range(3)]
    kept.append(pfb.numpy_function(fresh, [tf.ones([1000])], tf.float32))
    assert [address(t) for t in kept] == made, "not zero-copy"
    views = [pfb.to_numpy(t) for t in kept]
    kept.append(pfb.py_function(lambda a: a + 1, [tf.ones([1000])], tf.float32))
""")

scenario("tf_data_iterator_mid_flight")("""
    import time
    import tensorflow as tf, pyfunc_bridge as pfb

    def slow(v):
        time.sleep(0.001)
        return v + 1

    ds = (tf.data.Dataset.range(10**9)
          .map(lambda i: pfb.numpy_function(slow, [i], tf.int64), num_parallel_calls=4)
          .map(lambda i: pfb.py_function(lambda v: v * 2, [i], tf.int64),
               num_parallel_calls=4)
          .prefetch(16))
    it = iter(ds)
    assert int(next(it)) == 2
    next(it)
""")

scenario("unconsumed_to_dlpack_capsules")("""
    import numpy as np, tensorflow as tf, pyfunc_bridge as pfb

    t = tf.constant(np.arange(1000, dtype=np.float32))
    out = pfb.numpy_function(lambda a: a + 1, [t], tf.float32)
    exporter = pfb.to_dlpack(out)  # never consumed
    legacy = pfb.to_dlpack(out).__dlpack__()  # raw capsules, never consumed
    versioned = pfb.to_dlpack(t).__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
""")

scenario("torch_tensors_sharing_output_memory")("""
    import numpy as np, tensorflow as tf, torch, pyfunc_bridge as pfb

    def address(t):
        return np.asarray(t).__array_interface__["data"][0]

    inputs = []

    def keep_input(a):
        inputs.append(a)  # a torch view of TF's input memory, kept past the call
        return a * 2

    out = pfb.numpy_function(lambda: np.arange(1000, dtype=np.float32), [], tf.float32)
    shared = torch.from_dlpack(pfb.to_dlpack(out))
    result = pfb.array_function(keep_input, [tf.ones([1000])], tf.float32, framework="torch")
    shared_result = torch.from_dlpack(pfb.to_dlpack(result))
    assert shared.data_ptr() == address(out)
    assert shared_result.data_ptr() == address(result)
""")

# Eagerly, SystemExit leaves the function as it leaves TF's numpy_function.
scenario("sys_exit_in_eager_function", status=7)("""
    import sys
    import tensorflow as tf, pyfunc_bridge as pfb

    pfb.numpy_function(lambda a: sys.exit(7), [tf.constant(1.0)], tf.float32)
""")

# In a graph it is an error of the op (TF: UnknownError), here left unhandled.
scenario("sys_exit_in_graph_function", status=1, stderr="UnknownError\n")("""
    import sys
    import tensorflow as tf, pyfunc_bridge as pfb

    sys.excepthook = lambda kind, value, tb: print(kind.__name__, file=sys.stderr)

    @tf.function
    def f(x):
        return pfb.numpy_function(lambda a: sys.exit(7), [x], tf.float32)

    f(tf.constant(1.0))
""")

scenario("unhandled_exception_from_function", status=1, stderr="UnknownError\n")("""
    import sys
    import tensorflow as tf, pyfunc_bridge as pfb

    sys.excepthook = lambda kind, value, tb: print(kind.__name__, file=sys.stderr)
    ds = tf.data.Dataset.range(100).map(
        lambda i: pfb.py_function(lambda v: 1 // 0, [i], tf.int64), num_parallel_calls=2)
    for _ in ds:
        pass
""")

_DAEMON_THREADS = """
    import threading, time
    import tensorflow as tf, pyfunc_bridge as pfb

    v = tf.constant([1.0, 2.0])

    def loop():
        while True:
            {call}

    for _ in range(2):
        threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.3)
"""

scenario("daemon_threads_in_py_function")(_DAEMON_THREADS.format(
    call="pfb.py_function(lambda a: a + 1, [v], tf.float32)"))
scenario("daemon_threads_in_numpy_function")(_DAEMON_THREADS.format(
    call="pfb.numpy_function(lambda a: a + 1, [v], tf.float32)"))
# Traced once before the threads start: a trace still under way at exit is
# TF's own race (AutoGraph's temporary file removed under it), not the calls'.
scenario("daemon_threads_in_tf_function")(_DAEMON_THREADS.format(
    call="f(v)").replace("v = tf", """
    @tf.function
    def f(x):
        y = pfb.numpy_function(lambda a: a + 1, [x], tf.float32)
        return pfb.py_function(lambda a: a * 2, [y], tf.float32)

    v = tf""").replace("\n    def loop", "\n    f(v)\n\n    def loop"))

scenario("tf1_session_py_function")("""
    import tensorflow as tf, pyfunc_bridge as pfb

    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(tf.float32, [None])
    y = pfb.py_function(lambda a: a * 2, [x], tf.float32)
    z = pfb.numpy_function(lambda a: a + 1, [y], tf.float32)
    with tf.compat.v1.Session() as sess:
        for _ in range(5):
            assert sess.run(z, {x: [1.0, 2.0]}).tolist() == [3.0, 5.0]
""")


# Forks RUNS children per scenario (PARALLEL at a time) and prints one JSON
# line per run.  A run that outlives TIMEOUT seconds is killed and reported.
# gc.freeze(): the final collections of each child skip the objects of the
# imports (exit then costs about 0.5 s instead of 2.5 s); what a program makes
# after the fork is finalized as usual.
RUNNER = "kernel/faults_runner.py"

# Written before absl's logging is set up, whatever TF_CPP_MIN_LOG_LEVEL says.
_STARTUP_LOG = "WARNING: All log messages before absl::InitializeLog() is called"
# An absl log line ("I0000 00:00:1795777268.819967   21311 port.cc:153] ..."),
# and the kernel's own sources, whose lines are no noise.
_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] ")
_OURS = {os.path.basename(f) for f in glob.glob(os.path.join(ROOT, "src", "*", "*.c*"))}


def _noise(stderr):
    """stderr without TF's startup log lines: those absl writes before it is
    set up, and those of TF's own sources, which a GPU build writes in a
    process that sees no GPU (oneDNN's notice, cuInit's failure)."""
    def tf_log(line):
        found = _LOG_LINE.match(line)
        return found is not None and found.group(1) not in _OURS
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith(_STARTUP_LOG) and not tf_log(line))


@pytest.fixture(scope="module")
def fault_runs(tmp_path_factory):
    """Every scenario, RUNS times: scenario -> list of (status, stderr)."""
    programs = {name: program for name, (program, _, _) in SCENARIOS.items()}
    try:
        import torch  # noqa: F401
    except ImportError:
        programs.pop("torch_tensors_sharing_output_memory")
    out = tmp_path_factory.mktemp("faults")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with started_python(RUNNER, RUNS, PARALLEL, 60, out, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env=env, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(json.dumps(programs), timeout=600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the runner and any child it left
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, stderr[-3000:]
    results = {name: [] for name in programs}
    for line in stdout.splitlines():
        run = json.loads(line)
        results[run["scenario"]].append((run["status"], _noise(run["stderr"])))
    return results


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_run_exits_as_expected_with_nothing_on_stderr(fault_runs, name):
    if name not in fault_runs:
        pytest.skip("torch is not installed")
    _, status, stderr = SCENARIOS[name]
    runs = fault_runs[name]
    assert len(runs) == RUNS
    bad = [(got, err) for got, err in runs if got != status or err != stderr]
    assert not bad, (f"{len(bad)} of {RUNS} runs ended otherwise than with status "
                     f"{status} and stderr {stderr!r}; first: status {bad[0][0]}, "
                     f"stderr:\n{bad[0][1][-3000:]}")


# ------------------------------------- the exit hook's threading.excepthook --

@pytest.fixture
def quiet_hook(monkeypatch):
    """The excepthook the exit hook installs, over a recording one."""
    import threading

    import pyfunc_bridge as pfb
    printed = []
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args))
    pfb._library._quiet_cancelled_daemon_threads()
    return threading.excepthook, printed


def _hook_args(exc, daemon):
    import threading
    thread = threading.Thread(target=lambda: None, daemon=daemon)
    return threading.ExceptHookArgs((type(exc), exc, None, thread))


@pytest.mark.parametrize("exc, daemon, reported", [
    ("refused", True, False),   # the exit refused its call: ends silently
    ("refused", False, True),   # not a daemon thread
    ("other_cancel", True, True),  # a CancelledError of something else
    ("other", True, True),
])
def test_the_exit_hook_silences_only_refused_calls_of_daemon_threads(
        quiet_hook, exc, daemon, reported):
    import tensorflow as tf

    import pyfunc_bridge as pfb
    error = {
        "refused": tf.errors.CancelledError(
            None, None, pfb._library._SHUTDOWN_ERROR + " (it is shutting down)"),
        "other_cancel": tf.errors.CancelledError(None, None, "cancelled by the user"),
        "other": RuntimeError(pfb._library._SHUTDOWN_ERROR),
    }[exc]
    hook, printed = quiet_hook
    hook(_hook_args(error, daemon))
    assert [args.exc_value for args in printed] == ([error] if reported else [])


# ------------------------------------ daemon threads in TF's graph building --

# Two daemon threads build graphs without pause, as tracing does, when the
# program ends: they are in TF's graph-building wrappers, which take the GIL
# back in a noexcept destructor.  In a fresh interpreter every run aborted
# before the kernel parked such threads (forked runs finalize too fast to
# show it).
_BUILDING_GRAPHS = "kernel/faults_building_graphs.py"


_TF_TSTATE_FAULT = "Fatal Python error: PyThreadState_Get: the function must be called with the GIL held"


def test_daemon_threads_building_graphs_at_exit_let_it_end_cleanly():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    ended = []
    with contextlib.ExitStack() as started:
        runs = [started.enter_context(started_python(
            _BUILDING_GRAPHS, env=env, text=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)) for _ in range(3)]
        for proc in runs:
            ended.append((proc.wait(timeout=300), _noise(proc.stderr.read())))
    # What the parking prevents: SIGABRT from std::terminate, and its words.
    # Not counted: a fault of TF's own on Python 3.13, where CPython's
    # pthread_exit of such a thread unwinds through a pybind11 destructor of
    # TF's graph building (PyOperation._init_outputs) that frees a tuple with
    # no thread state left (seen in a core's stack; no bridge frame on it).  (One run
    # of 3 once ended with SIGSEGV, nothing on stderr, on Python 3.12 under a
    # 2-core machine's double load: another exit fault, still open.)
    aborted = [(status, err) for status, err in ended
               if (status == -signal.SIGABRT and _TF_TSTATE_FAULT not in err)
               or "terminate called" in err or "exception not rethrown" in err]
    assert aborted == []
