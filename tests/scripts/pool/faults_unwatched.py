"""Run by tests/pool/test_process_pool_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import pyfunc_bridge as pfb
from pool_checks import call_pid

def stack_files():  # a pool with a timeout's trace files (timeouts.py, Deadlines.prepare)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "unwatched-stack" in os.readlink(f"/proc/self/fd/{fd}"):
                found.append(fd)
        except OSError:
            continue  # the descriptor listdir itself used
    return found


pool = pfb.ProcessPool(1, name="unwatched", timeout=600)
start = threading.Thread.start

def failing_start(self):  # the replacement's reader thread cannot start
    if self.name == "unwatched reader 0":
        threading.Thread.start = start
        raise RuntimeError("can't start new thread")
    start(self)

threading.Thread.start = failing_start
os.kill(pool.pids()[0], signal.SIGKILL)
deadline = time.monotonic() + 60
while threading.Thread.start is not start:
    assert time.monotonic() < deadline, "no replacement was started"
    time.sleep(0.01)
for pid in pool.pids():  # a worker left without a reader: its death too must be seen
    os.kill(pid, signal.SIGKILL)
box = {}
caller = threading.Thread(target=call_pid, args=(pool, box), daemon=True)
caller.start()
caller.join(60)
if caller.is_alive():
    print(f"the call still waits; workers {pool.pids()}", file=sys.stderr, flush=True)
    os._exit(1)
assert ("pid" in box and box["pid"] in pool.pids()
        or "reader thread could not be started" in box["error"]), box
pool.close()
assert stack_files() == [], stack_files()  # none left open by the worker without a reader
print("done")
