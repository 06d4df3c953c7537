"""Ctrl-C while a call waits for its one worker, which is held, again and
again: the interrupt lands once the call's input is placed, at any moment of
its wait, also just before the wait blocks (the wait must look for it
itself).

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
main = threading.main_thread().ident
BLOCK = 4000  # the waiting call's input: 1000 float32, in one block
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="queued pool") as pool:
    for round in range(12):
        go = f"{sys.argv[1]}-{round}"
        holder = threading.Thread(target=pfb.numpy_function,
                                  args=(pf.wait_for_file, [tf.constant(go)], tf.int64),
                                  kwargs={"executor": pool})
        holder.start()
        while pool.free_input_bytes == pool.arena_bytes:  # the holder's input is placed
            time.sleep(0.01)
        held = pool.free_input_bytes
        def interrupt_once_queued():
            while pool.free_input_bytes > held - BLOCK:  # the call's input is placed
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)
        interrupter = threading.Thread(target=interrupt_once_queued)
        interrupter.start()
        try:
            pfb.numpy_function(pf.double, [tf.fill([1000], 1.0)], tf.float32, executor=pool)
            raise AssertionError("not interrupted")
        except KeyboardInterrupt:
            pass
        interrupter.join()
        open(go, "w").close()
        holder.join()
        # The abandoned call's input block went back (at once, or once its
        # worker ran it), and its result's too: nothing is held for good.
        while pool.free_input_bytes != pool.arena_bytes:  # the state, or the timeout
            time.sleep(0.01)
    out = pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32, executor=pool)
    np.testing.assert_array_equal(out.numpy(), np.full(1000, 4.0))
print("done")
