"""Forks RUNS children per scenario (PARALLEL at a time) and prints one JSON
line per run.  A run that outlives TIMEOUT seconds is killed and reported.
gc.freeze(): the final collections of each child skip the objects of the
imports (exit then costs about 0.5 s instead of 2.5 s); what a program makes
after the fork is finalized as usual.

Run by tests/kernel/test_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import gc, json, os, runpy, signal, sys, threading, time
scenarios = json.loads(sys.stdin.read())
runs, parallel, timeout, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def native_threads():
    return len(os.listdir("/proc/self/task"))

import numpy
threads = native_threads()  # with OpenBLAS's pool, which handles fork
import tensorflow, pyfunc_bridge
try:
    import torch
except ImportError:
    pass
# The forkserver pattern: imports only.  A fork after TensorFlow has run
# (its eager context, its thread pools) is not safe.
from tensorflow.python.eager import context
assert context._context is None or not context._context._initialized, (
    "the runner created TensorFlow's eager context before forking")
# Forking is safe only while the imports started no thread (GPU builds of TF
# or torch may): otherwise each run gets a fresh interpreter.
forking = threading.active_count() == 1 and native_threads() == threads
paths = {}
for name, program in scenarios.items():
    paths[name] = os.path.join(out, name + ".py")  # a file: autograph reads the source
    with open(paths[name], "w") as f:
        f.write(program)
gc.freeze()
todo = [(name, i) for i in range(runs) for name in scenarios]
running = {}
while todo or running:
    while todo and len(running) < parallel:
        name, i = todo.pop(0)
        err = os.path.join(out, f"{name}.{i}.err")
        if not forking:
            pid = os.posix_spawn(sys.executable, [sys.executable, paths[name]], os.environ,
                                 file_actions=[
                                     (os.POSIX_SPAWN_OPEN, 2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                                     (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
        else:
            pid = os.fork()
        if pid == 0:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            del todo, running
            # The child runs the program as __main__, then exits normally.
            runpy.run_path(paths[name], run_name="__main__")
            sys.exit(0)
        running[pid] = (name, i, err, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        for pid, (name, i, err, start) in list(running.items()):
            if time.monotonic() - start > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                print(json.dumps({"scenario": name, "run": i, "status": "timeout",
                                  "stderr": open(err, errors="replace").read()}), flush=True)
        time.sleep(0.01)
        continue
    name, i, err, start = running.pop(pid)
    code = os.waitstatus_to_exitcode(status)
    print(json.dumps({"scenario": name, "run": i, "status": code, "seconds": time.monotonic() - start,
                      "stderr": open(err, errors="replace").read()}), flush=True)
