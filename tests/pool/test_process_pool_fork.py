"""Process workers across fork(): the child gets a clear error for its
parent's pool and lets go of its shared memory, and the parent's pool goes on
with the same workers."""
import json
import subprocess
import sys

from conftest import ROOT, TESTS, script_env
from pool_checks import worker_alive
from process_pool_helpers import run_script
from process_pool_helpers import failing_start  # noqa: F401 (fixtures)


# A fork of a process that has pools: the child gets a clear error for the
# parent's pool and a fresh default pool, runs its exit hooks, and the
# parent's pools go on with the same workers.
_FORK_SCRIPT = r"""
import json, os, signal, sys, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pyfunc_bridge.pool import process_pool as _process

def run(executor):
    return int(pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=executor))

pool = pfb.ProcessPool(1, name="forked pool", timeout=60)
before = {"pool": pool.pids(), "default": _process.default_pool().pids(),
          "calls": [run(pool), run("process")]}
child = os.fork()
if child == 0:
    report = {}
    for how in ("api", "run"):
        try:
            if how == "api":
                run(pool)
            else:  # a graph built before the fork reaches the pool itself
                pool.ring_call(pf.pid, None, (np.int64(0),), False, False)
        except Exception as exc:  # noqa: BLE001 - reported
            report[how] = f"{type(exc).__name__}: {exc}"
    report["default"] = run("process")
    report["default_pids"] = _process.default_pool().pids()
    print("child " + json.dumps(report), flush=True)
    # The exit hooks close this process's pools (and must not touch the
    # parent's).  Then os._exit: TensorFlow's own finalization hangs in a
    # fork of a process that ran an eager op (tf.numpy_function's too).
    import atexit
    atexit._run_exitfuncs()
    os._exit(0)
deadline = time.monotonic() + 60
while os.waitpid(child, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        print("child hung", flush=True)
        break
    time.sleep(0.05)
time.sleep(0.5)  # what the child's exit did to the parent's workers is done
after = {"pool": pool.pids(), "default": _process.default_pool().pids(),
         "calls": [run(pool), run("process")]}
print("parent " + json.dumps({"before": before, "after": after}), flush=True)
"""


def test_a_forked_child_gets_a_clear_error_and_the_parent_pool_is_unaffected():
    run = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], cwd=TESTS, capture_output=True,
                         text=True, timeout=240,
                         env=script_env(ROOT, TESTS))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "child hung" not in run.stdout  # on the parent's pool
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    child = json.loads(lines["child"])
    parent = json.loads(lines["parent"])
    for how, error in (("api", child["api"]), ("run", child["run"])):
        assert "'forked pool'" in error or "forked pool " in error, (how, error)
        assert "is a fork of it" in error and "Start a ProcessPool in this process" in error
    assert child["api"].startswith("PoolClosedError[FailedPreconditionError]")  # (eager)
    assert child["run"].startswith("PoolClosedError")
    # The child's default pool is its own; the parent's workers are the same ones.
    assert child["default"] in child["default_pids"]
    assert not set(child["default_pids"]) & set(parent["before"]["default"])
    # The same workers, and each call ran in one of its pool's (which of the
    # default pool's two takes a call is the pool's choice).
    for state in (parent["before"], parent["after"]):
        assert state["calls"][0] in state["pool"] and state["calls"][1] in state["default"]
    assert {k: parent["after"][k] for k in ("pool", "default")} == \
        {k: parent["before"][k] for k in ("pool", "default")}
    assert not [p for p in child["default_pids"] if worker_alive(p)]  # ended at the child's exit


# A forked child lets go of its parent's pools' shared memory: it holds no
# descriptor of their memfds and maps none of them (their mappings are its
# own memory now), the result tensors it inherited (from the Python path
# and from a kernel's native route) keep their values while the parent
# lets go of their blocks and the worker reuses them, and using the pool
# there is a clear error.
_FORK_KEEPS_RESULT_SCRIPT = r"""
import json, os, signal, time
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import child_exit_code, memfds_of
NAME = "fork result pool"

def shared():
    return memfds_of(NAME)

with pfb.ProcessPool(1, name=NAME) as pool:
    graph = tf.function(lambda x: pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32,
                                                     executor=pool))
    graph(tf.constant(0.0))  # the kernel's first call sets up its route
    eager = pfb.numpy_function(pf.quarter_mib_of, [tf.constant(1.0)], tf.float32,
                               executor=pool)
    native = graph(tf.constant(2.0))
    addresses = {pfb.to_numpy(eager).ctypes.data, pfb.to_numpy(native).ctypes.data}
    x = tf.constant(3.0)
    fds, maps = shared()
    assert fds and maps, (fds, maps)  # (the probe sees them)
    go_r, go_w = os.pipe()
    seen_r, seen_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(go_r, 1)  # the parent let go of the blocks, and the worker reused them
        report = {"values": [float(v) for t in (eager, native)
                             for v in (pfb.to_numpy(t)[0], pfb.to_numpy(t)[-1])]}
        report["fds"], report["maps"] = shared()
        try:
            pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32, executor=pool)
        except tf.errors.FailedPreconditionError as exc:
            report["error"] = str(exc)
        os.write(seen_w, json.dumps(report).encode())
        os._exit(0)  # (TensorFlow's own exit hangs in a fork of a process that ran ops)
    del eager, native
    later = [pfb.numpy_function(pf.quarter_mib_of, [tf.constant(7.0)], tf.float32,
                                executor=pool) for _ in range(2)]
    later += [graph(tf.constant(7.0)) for _ in range(2)]
    reused = addresses & {pfb.to_numpy(t).ctypes.data for t in later}
    os.write(go_w, b"x")
    report = json.loads(os.read(seen_r, 1 << 16).decode())
    child_exit_code(child, "the child hung")
    assert report["values"] == [1.0, 1.0, 2.0, 2.0], (report, reused)
    assert report["fds"] == [] and report["maps"] == [], report
    error = report.get("error", "")
    assert f"'{NAME}'" in error and "is a fork of it" in error and \
        "Start a ProcessPool in this process" in error, report
    assert [float(t[0]) for t in later] == [7.0] * 4
print("done")
"""


def test_a_forked_child_lets_go_of_the_pool_s_memory_and_keeps_its_results():
    run_script(_FORK_KEEPS_RESULT_SCRIPT)


# A fork of a process whose pool holds a dead worker (a broken pool: its
# workers exit as they start): the child closes only descriptors the pool
# still owns.  The dead worker's socket was closed in the parent, and its
# number may by then be another file's, which the child must keep.
_FORK_BROKEN_SCRIPT = r"""
import os, sys
from pool_checks import broken_pool

def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False

pool = broken_pool(1, "broken forked pool", sys.argv[1])
# Every free descriptor number below 256 now holds one end of this pipe.
read_end, _ = os.pipe()
held = [fd for fd in range(3, 256) if not is_open(fd)]
for fd in held:
    os.dup2(read_end, fd)
child = os.fork()
if child == 0:
    os._exit(len([fd for fd in held if not is_open(fd)]))
_, status = os.waitpid(child, 0)
assert os.waitstatus_to_exitcode(status) == 0, (
    f"the child closed {os.waitstatus_to_exitcode(status)} descriptors it did not own")
pool.close()
print("done")
"""


def test_a_forked_child_closes_only_descriptors_its_parent_s_pool_owns(failing_start):
    run_script(_FORK_BROKEN_SCRIPT, failing_start)


# A fork while a worker starts (its start, on the spawning thread, is held
# just before the worker's process runs, when its socket ends and doorbell
# exist): the child holds none of them.  A fork waits for a start to give its
# worker to the pool, so the start is held only until the fork returns, or
# for a few seconds where the fork waits for it.
_FORK_DURING_START_SCRIPT = r"""
import os, sys, threading
import pyfunc_bridge as pfb
from pool_checks import descriptors

in_start, forked = threading.Event(), threading.Event()

def hold_the_start(event, args):
    if (event == "subprocess.Popen" and "start_worker" in str(args[1])
            and not in_start.is_set()):
        in_start.set()
        forked.wait(5)  # (the bound: a fork that waits for this start)

# The result arenas' copy must come after the wait for the start (workers
# write on meanwhile), under the lock that makes one fork own it at a time.
from pyfunc_bridge.pool import fork, spawn
copy, copied_holding = fork.before_fork, []
fork.before_fork = lambda names: (copied_holding.append(spawn.spawner.descriptors._is_owned()),
                                  copy(names))

KINDS = ("socket:", "anon_inode:[eventfd]")  # a worker's socket ends and doorbell
before = set(descriptors(*KINDS))
sys.addaudithook(hold_the_start)
box = {}
starting = threading.Thread(target=lambda: box.update(pool=pfb.ProcessPool(1, name="started")))
starting.start()
in_start.wait()
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.write(write_end, repr(sorted(set(descriptors(*KINDS)) - before)).encode())
    os._exit(0)
forked.set()
os.close(write_end)
held = os.read(read_end, 1 << 16).decode()
os.waitpid(child, 0)
starting.join()
box["pool"].close()
assert held == "[]", f"the forked child held the starting worker's {held}"
assert copied_holding == [True], f"the arenas were copied before the wait: {copied_holding}"
print("done")
"""

_CTRL_C_WHILE_A_FORK_WAITS_SCRIPT = r"""
import os, signal, sys, threading, time
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import spawn

main = threading.main_thread()
in_start, done = threading.Event(), threading.Event()

def waits_in_fork():
    frame = sys._current_frames().get(main.ident)
    while frame is not None:
        if frame.f_code.co_name == "before_fork":
            return True
        frame = frame.f_back
    return False

def hold_the_start(event, args):
    if (event == "subprocess.Popen" and "start_worker" in str(args[1])
            and not in_start.is_set()):
        in_start.set()
        deadline = time.monotonic() + 60
        while not waits_in_fork():
            assert time.monotonic() < deadline, "the fork never waited for the start"
            time.sleep(0.001)
        signal.pthread_kill(main.ident, signal.SIGINT)

sys.addaudithook(hold_the_start)
box = {}
starting = threading.Thread(target=lambda: box.update(pool=pfb.ProcessPool(1, name="started")))
starting.start()
in_start.wait()
outcome = "no KeyboardInterrupt"
try:
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
except KeyboardInterrupt:
    outcome = "interrupted"
starting.join()
assert outcome == "interrupted", outcome
assert spawn.spawner.descriptors.acquire(blocking=False), "the fork left the lock held"
spawn.spawner.descriptors.release()
box["pool"].close()
with pfb.ProcessPool(1, name="after") as pool:  # a start after it takes the lock
    pool.pids()
print("done")
"""


def test_a_fork_while_a_worker_starts_leaves_the_child_none_of_its_descriptors():
    run_script(_FORK_DURING_START_SCRIPT)


def test_a_ctrl_c_while_a_fork_waits_for_a_start_comes_after_the_fork():
    # A fork hook cannot raise: the wait goes on, and the Ctrl-C is raised
    # once the fork is done (before, it skipped the wait and left the child
    # the starting worker's descriptors).
    run_script(_CTRL_C_WHILE_A_FORK_WAITS_SCRIPT)


_FORK_WHILE_PICKLING_SCRIPT = r"""
import os, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
from pool_checks import child_exit_code

pickling, forked = threading.Event(), threading.Event()

class SlowToPickle:
    def __call__(self, a):
        return a
    def __reduce__(self):  # the parent's pickling is under way at the fork
        pickling.set()
        forked.wait(60)
        return (SlowToPickle, ())

pool = pfb.ProcessPool(1, name="parent")
caller = threading.Thread(target=lambda: pfb.numpy_function(
    SlowToPickle(), [tf.constant(1.0)], tf.float32, executor=pool))
caller.start()
assert pickling.wait(60), "the call never pickled its function"
child = os.fork()
if child == 0:
    y = pfb.numpy_function(np.negative, [tf.constant(2.0)], tf.float32, executor="process")
    os._exit(0 if float(y) == -2.0 else 3)
forked.set()
code = child_exit_code(child, "the child's first pool call waited for the parent's pickling")
assert code == 0, code
caller.join(60)
pool.close()
print("done")
"""


def test_a_fork_while_a_function_pickles_leaves_the_child_able_to_pickle():
    run_script(_FORK_WHILE_PICKLING_SCRIPT)


# A fork while a TF thread of the parent is inside a bridge call (an
# in-process numpy_function in a tf.function): that call is not in the child,
# and the child's exit (sys.exit after a pool call) does not wait for it
# (it waited 10 s, the bound of its wait for the calls under way).
_EXIT_AFTER_A_FORK_SCRIPT = r"""
import os, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
from pool_checks import child_exit_code
from pyfunc_bridge import _library

inside, forked = threading.Event(), threading.Event()

def waits(x):
    inside.set()
    forked.wait(60)
    return x

graph = tf.function(lambda x: pfb.numpy_function(waits, [x], tf.float32))
caller = threading.Thread(target=graph, args=(tf.constant(1.0),))
caller.start()
assert inside.wait(60), "the parent's call never began"
child = os.fork()
if child == 0:
    # (Eager only: TensorFlow runs a tf.function on threads that a child lacks.)
    y = pfb.numpy_function(np.negative, [tf.constant(2.0)], tf.float32, executor="process")
    drain = _library._begin_shutdown

    def exit_drain():  # the exit's wait for the bridge calls under way
        left = drain()
        if left:
            print(f"the child's exit waited for {left} calls", file=sys.stderr, flush=True)
            os._exit(4)
        return left
    _library._begin_shutdown = exit_drain
    sys.exit(0 if float(y) == -2.0 else 3)
code = child_exit_code(child, "the child's exit hung")
forked.set()
caller.join(60)
assert code == 0, code
print("done")
"""


def test_a_forked_child_s_exit_does_not_wait_for_its_parent_s_calls():
    run_script(_EXIT_AFTER_A_FORK_SCRIPT)
