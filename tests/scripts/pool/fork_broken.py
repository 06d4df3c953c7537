"""A fork of a process whose pool holds a dead worker (a broken pool: its
workers exit as they start): the child closes only descriptors the pool
still owns.  The dead worker's socket was closed in the parent, and its
number may by then be another file's, which the child must keep.

Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, sys
from pool_checks import broken_pool

def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False

pool = broken_pool(1, "broken forked pool", sys.argv[1])
# Every free descriptor number below 256 now holds one end of this pipe.
read_end, _ = os.pipe()
held = [fd for fd in range(3, 256) if not is_open(fd)]
for fd in held:
    os.dup2(read_end, fd)
child = os.fork()
if child == 0:
    os._exit(len([fd for fd in held if not is_open(fd)]))
_, status = os.waitpid(child, 0)
assert os.waitstatus_to_exitcode(status) == 0, (
    f"the child closed {os.waitstatus_to_exitcode(status)} descriptors it did not own")
pool.close()
print("done")
