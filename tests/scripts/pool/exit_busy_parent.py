"""Two workers stuck in functions (one asleep, one looping in Python), then the
parent dies as the test says: killed (by the test) or os._exit.

Run by tests/pool/test_process_pool_exit.py in a fresh interpreter
(tests/fresh_python.py)."""
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
