"""A fork while a worker starts (its start, on the spawning thread, is held
just before the worker's process runs, when its socket ends and doorbell
exist): the child holds none of them.  A fork waits for a start to give its
worker to the pool, so the start is held only until the fork returns, or for
a few seconds where the fork waits for it.

Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, sys, threading
import pyfunc_bridge as pfb
from pool_checks import descriptors

in_start, forked = threading.Event(), threading.Event()

def hold_the_start(event, args):
    if (event == "subprocess.Popen" and "start_worker" in str(args[1])
            and not in_start.is_set()):
        in_start.set()
        forked.wait(5)  # (the bound: a fork that waits for this start)

# The result arenas' copy must come after the wait for the start (workers
# write on meanwhile), under the lock that makes one fork own it at a time.
from pyfunc_bridge.pool import fork, spawn
copy, copied_holding = fork.before_fork, []
fork.before_fork = lambda names: (copied_holding.append(spawn.spawner.descriptors._is_owned()),
                                  copy(names))

KINDS = ("socket:", "anon_inode:[eventfd]")  # a worker's socket ends and doorbell
before = set(descriptors(*KINDS))
sys.addaudithook(hold_the_start)
box = {}
starting = threading.Thread(target=lambda: box.update(pool=pfb.ProcessPool(1, name="started")))
starting.start()
in_start.wait()
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.write(write_end, repr(sorted(set(descriptors(*KINDS)) - before)).encode())
    os._exit(0)
forked.set()
os.close(write_end)
held = os.read(read_end, 1 << 16).decode()
os.waitpid(child, 0)
starting.join()
box["pool"].close()
assert held == "[]", f"the forked child held the starting worker's {held}"
assert copied_holding == [True], f"the arenas were copied before the wait: {copied_holding}"
print("done")
