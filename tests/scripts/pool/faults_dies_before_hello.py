"""A replacement worker that has exited before the pool sends its hello (a
start that fails at once on a loaded machine): the send's broken pipe is
that worker's death, handled as any start that ended before it was ready;
the next worker then serves the pool's calls.

Run by tests/pool/test_process_pool_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import pyfunc_bridge as pfb
from pool_checks import call_pid
from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.worker import start_worker

failing, real, popen = sys.argv[1], start_worker.__file__, spawner.popen


def exited(pid):
    """Whether `pid` has exited and is not yet reaped (a zombie)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def exits_first(args, **kwargs):
    proc = popen(args, **kwargs)
    if failing in args:
        start_worker.__file__ = real  # the next start serves
        deadline = time.monotonic() + 120
        while not exited(proc.pid):  # the state a loaded machine reaches by chance
            assert time.monotonic() < deadline, "the failing worker never exited"
            time.sleep(0.005)
    return proc


pool = pfb.ProcessPool(1, name="dies before hello")
first = pool.pids()[0]
spawner.popen = exits_first
start_worker.__file__ = failing
os.kill(first, signal.SIGKILL)
box = {}
caller = threading.Thread(target=call_pid, args=(pool, box), daemon=True)
caller.start()
caller.join(300)
counted = pfb.stats().pools.get("dies before hello")  # absent while nothing is counted
replaced = counted.workers_replaced if counted else 0
if caller.is_alive() or "error" in box or box["pid"] not in pool.pids():
    print(f"the call: {box or 'still waits'}; workers {pool.pids()}; replaced {replaced}",
          file=sys.stderr, flush=True)
    os._exit(1)  # (close() would wait for a worker the pool still holds)
assert box["pid"] != first and replaced == 2, (box, first, replaced)
pool.close()
print("done")
