"""A caller that stops waiting before its worker pulls the input: the worker is
told the input is gone (its call fails, nobody waits for it), and the next
calls run.

Run by tests/pool/test_pool_socket_inputs.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
gate = sys.argv[1]
marks = os.environ["PFB_TEST_MARKS"] = gate + ".marks"
os.mkdir(marks)
main = threading.main_thread()
def waiting(thread):
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"
with pfb.ProcessPool(1, arena_bytes=4096, name="gone pool") as pool:
    held = threading.Thread(target=lambda: pfb.numpy_function(
        pf.wait_for_file, [tf.constant(gate)], tf.int64, executor=pool))
    held.start()
    while not os.listdir(marks):  # the worker is held: the next call waits behind it
        time.sleep(0.01)
    def interrupt():
        while not waiting(main):
            time.sleep(0.01)
        time.sleep(0.1)  # (the caller is in its wait: its signal check runs every 50 ms)
        signal.pthread_kill(main.ident, signal.SIGINT)
    threading.Thread(target=interrupt).start()
    try:
        pfb.numpy_function(pf.double, [tf.ones([64 << 10])], tf.float32, executor=pool)
        raise SystemExit("not interrupted")
    except KeyboardInterrupt:
        pass
    open(gate, "w").close()
    held.join()
    x = np.arange(64 << 10, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(
            pfb.numpy_function(pf.double, [tf.constant(x)], tf.float32, executor=pool).numpy(),
            x * 2)
print("done")
