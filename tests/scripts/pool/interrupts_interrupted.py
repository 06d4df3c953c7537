"""Ctrl-C in the waiting caller, again and again, in a fresh interpreter (a
signal, and a hang to stop by the timeout).  Each interrupted call stays
with the pool (queued, or in its worker); its blocks must stay its own until
the worker is done with them: inputs (else the next call's input is the
block it writes to in place) and results (else they fill the worker's result
arena).

Run by tests/pool/test_process_pool_interrupts.py in a fresh interpreter
(tests/fresh_python.py)."""
import signal, sys, threading, time
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import in_arena, settled
FRAMEWORK = sys.argv[1]  # numpy or torch
BLOCK = 4 << 20  # one 1 Mi-element float32 input or result
main = threading.main_thread()

def call(value):
    x = tf.fill([1 << 20], float(value))
    if FRAMEWORK == "numpy":
        return pfb.numpy_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                                  executor=pool)
    return pfb.array_function(pf.slow_double_in_place, [x], tf.float32, copy=True,
                              framework=FRAMEWORK, executor=pool)

def waiting():  # the main thread waits in the pool (its innermost Python frame)
    frame = sys._current_frames().get(main.ident)
    return frame is not None and frame.f_code.co_name == "ring_call"

def interrupt(moment, gate, returned):
    # SIGINT to the main thread at a moment of the call (a state it reaches,
    # never a time, which a loaded machine stretches): at once (its inputs
    # being made), or once it waits for its worker; never once it returned.
    ready = (lambda: True) if moment == "at once" else waiting
    while True:
        with gate:
            if returned:
                return
            if ready():
                signal.pthread_kill(main.ident, signal.SIGINT)
                return
        time.sleep(0.001)

with pfb.ProcessPool(1, arena_bytes=4 * BLOCK, name="interrupted pool") as pool:
    interrupted, most_held = 0, 0
    for i in range(12):
        gate, returned = threading.Lock(), []
        interrupter = threading.Thread(target=interrupt, args=(
            ("at once", "waiting", "waiting")[i % 3], gate, returned))
        try:
            interrupter.start()
            call(100 + i)
            with gate:  # (a SIGINT sent before this lands inside the try)
                returned.append(True)
        except KeyboardInterrupt:
            interrupted += 1
        interrupter.join()
        # The blocks of the calls still with the pool are theirs.
        most_held = max(most_held, pool.arena_bytes - pool.free_input_bytes)
    # (A KeyboardInterrupt raised in a gc callback is ignored: the call runs on.)
    # A call interrupted while its worker is busy keeps its input block
    # until the worker is done with it.
    assert interrupted >= 8 and most_held >= BLOCK, (interrupted, most_held)
    # The next calls run after the abandoned ones, which wrote in place to
    # their own blocks, not to these calls' inputs.
    for value in (10, 11, 12):
        out = call(value)
        np.testing.assert_array_equal(out.numpy(), np.full(1 << 20, 2.0 * value))
    # The abandoned calls' results went back to the worker: its arena still
    # has room for a 4 MiB result, which comes back through shared memory
    # (without copy=True, which copies every result).
    out = pfb.numpy_function(pf.identity, [tf.fill([1 << 20], 1.0)], tf.float32,
                             executor=pool)
    assert in_arena(pool, out)
    settled(pool)
print("done")
