"""A replacement worker that dies at once, whose death is handled while its
start is still under way: between the pool's two steps of that death (the
dispatcher's, then the worker's descriptors), the start attaches the worker
to the dispatcher.  The threads are held there by tracing (the one way to
order them); the next worker then serves the pool's calls.

Run by tests/pool/test_process_pool_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading
import pyfunc_bridge as pfb
from pool_checks import served_or_exit
from pyfunc_bridge.worker import start_worker

failing, real = sys.argv[1], start_worker.__file__
detached, attached, seen = threading.Event(), threading.Event(), set()

def victim(worker):
    return worker is not None and failing in worker.proc.args

def tracer(frame, event, arg):
    name, where = frame.f_code.co_name, frame.f_locals
    if name == "attach" and victim(where.get("worker")):
        seen.add("attach")
        if where["worker"].reader.ident is not None:  # its death may be handled first
            assert detached.wait(60), "the reader never handled the worker's death"
        return lambda frame, event, arg: attached.set() if event == "return" else None
    if name == "ended" and victim(where.get("self")) and not attached.is_set():
        seen.add("ended")
        detached.set()  # its death is in the dispatcher; its descriptors are still open
        assert attached.wait(60), "the start never attached the worker"
    return None

def on_start(event, args):
    if event == "subprocess.Popen" and failing in str(args[1]):
        start_worker.__file__ = real  # the next start serves
        sys.settrace(tracer)  # the spawning thread's

pool = pfb.ProcessPool(1, name="dies at once")
first = pool.pids()[0]
threading.settrace(tracer)  # the reader threads started from now on
sys.addaudithook(on_start)
start_worker.__file__ = failing
os.kill(first, signal.SIGKILL)
_, replaced = served_or_exit(pool, "dies at once", 120, also=seen)
assert "attach" in seen and replaced == 2, (seen, replaced)
pool.close()
print("done")
