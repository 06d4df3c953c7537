"""A worker killed with a call whose input it had not pulled yet behind its
running one: the running call fails with WorkerError, the other is resent
and its new worker pulls the input.

Run by tests/pool/test_pool_socket_inputs.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
marks = sys.argv[1]
os.environ["PFB_TEST_MARKS"] = marks
def waiting(thread):
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"
with pfb.ProcessPool(1, arena_bytes=4096, name="killed pool") as pool:
    outcome = {}
    def held():
        try:
            pfb.numpy_function(pf.hang, [tf.constant(60.0)], tf.int64, executor=pool)
        except Exception as exc:  # noqa: BLE001 - the worker died in it
            outcome["held"] = exc
    x = np.arange(64 << 10, dtype=np.float32)
    def pulled():
        outcome["pulled"] = pfb.numpy_function(pf.double, [tf.constant(x)], tf.float32,
                                               executor=pool).numpy()
    first = threading.Thread(target=held)
    first.start()
    while not os.listdir(marks):  # the worker is in hang()
        time.sleep(0.01)
    second = threading.Thread(target=pulled)
    second.start()
    while not waiting(second):
        time.sleep(0.01)
    time.sleep(0.1)  # (submitted: it waits in 50 ms slices)
    os.kill(int(os.listdir(marks)[0]), signal.SIGKILL)
    first.join()
    second.join()
    assert "held" in outcome, outcome
    np.testing.assert_array_equal(outcome["pulled"], x * 2)
    np.testing.assert_array_equal(
        pfb.numpy_function(pf.double, [tf.constant(x)], tf.float32, executor=pool).numpy(),
        x * 2)
print("done")
