"""A program that starts a pool (or the default pool) and ends as argv[1]
says: normally, with an unhandled exception, with calls in flight, or
killed while it sleeps.

Run by tests/pool/test_process_pool_exit.py in a fresh interpreter
(tests/fresh_python.py), from the checkout's root."""
import json, os, sys, tempfile, threading, time
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
                         kwargs={"executor": "process"}).start()
    while len(os.listdir(marks)) < min(2, len(pool.pids())):  # in their workers
        time.sleep(0.01)
if how == "unhandled":
    raise RuntimeError("unhandled in the main program")
if how == "killed":
    print("ready", flush=True)
    time.sleep(60)
