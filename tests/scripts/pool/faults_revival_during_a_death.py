"""A broken pool revived while one of its dead workers is still being handled
(its lost reaps it, for up to 5 s): held `before` the dead worker's slot is
detached, or `after`.  The revival and the dead worker's own replacement
start one worker for its slot between them, and the pool knows every worker.

Run by tests/pool/test_process_pool_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import pyfunc_bridge as pfb
from pool_checks import call_pid, worker_alive
from pyfunc_bridge.pool.supervision import Supervisor
from pyfunc_bridge.worker import start_worker

failing, window = sys.argv[1:]
Supervisor.retry_seconds = 0.2  # the back-off this script waits out
pool = pfb.ProcessPool(2, name="revived during a death")
supervisor = pool._supervisor
slow, other = pool.pids()
handling, go_on, handler = threading.Event(), threading.Event(), []
step = "death" if window == "before" else "replace"
real_step = getattr(supervisor, step)

def slow_step(worker, *args):
    if worker.pid == slow:
        handler.append(threading.current_thread())
        handling.set()
        go_on.wait(120)
    return real_step(worker, *args)

def workers():  # this process's live workers (children of its spawning thread)
    found = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found.update(int(pid) for pid in f.read().split())
    return {pid for pid in found if worker_alive(pid)}

setattr(supervisor, step, slow_step)
os.kill(slow, signal.SIGKILL)
assert handling.wait(120), "the dead worker was never handled"
start_worker.pool_module()  # loaded by its real path, before the workers fail
real, start_worker.__file__ = start_worker.__file__, failing
os.kill(other, signal.SIGKILL)  # its replacements end as they start: the pool breaks
deadline = time.monotonic() + 120
while not supervisor.broken or time.monotonic() < supervisor.retry_at:
    assert time.monotonic() < deadline, "the pool never broke"
    time.sleep(0.01)
start_worker.__file__ = real
box = {}
caller = threading.Thread(target=call_pid, args=(pool, box))  # it revives the pool
caller.start()
while caller.is_alive() and not pool.pids():  # (its call may wait for the slow slot)
    time.sleep(0.01)
go_on.set()
caller.join(120)
handler[0].join(120)
live = workers()
pids = pool.pids()
pool.close()
assert len(pids) == 2 and live == set(pids), (live, pids, box)
assert box.get("pid") in pids, box
assert not [pid for pid in live if worker_alive(pid)], "close() left a worker running"
print("done")
