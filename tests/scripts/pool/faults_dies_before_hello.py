"""A replacement worker that has exited before the pool sends its hello (a
start that fails at once on a loaded machine): the send's broken pipe is
that worker's death, handled as any start that ended before it was ready;
the next worker then serves the pool's calls.

Run by tests/pool/test_process_pool_faults.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, time
import pyfunc_bridge as pfb
from pool_checks import served_or_exit
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
served, replaced = served_or_exit(pool, "dies before hello", 300)
assert served != first and replaced == 2, (served, first, replaced)
pool.close()
print("done")
