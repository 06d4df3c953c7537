"""A fork of a process that has pools: the child gets a clear error for the
parent's pool and a fresh default pool, runs its exit hooks, and the
parent's pools go on with the same workers.

Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os, signal, time
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
