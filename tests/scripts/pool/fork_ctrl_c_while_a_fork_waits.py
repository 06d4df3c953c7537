"""Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import os, signal, sys, threading, time
import pyfunc_bridge as pfb
from pyfunc_bridge.pool import spawn

main = threading.main_thread()
in_start, done = threading.Event(), threading.Event()

def waits_in_fork():
    frame = sys._current_frames().get(main.ident)
    while frame is not None:
        if frame.f_code.co_name == "before_fork":
            return True
        frame = frame.f_back
    return False

def hold_the_start(event, args):
    if (event == "subprocess.Popen" and "start_worker" in str(args[1])
            and not in_start.is_set()):
        in_start.set()
        deadline = time.monotonic() + 60
        while not waits_in_fork():
            assert time.monotonic() < deadline, "the fork never waited for the start"
            time.sleep(0.001)
        signal.pthread_kill(main.ident, signal.SIGINT)

sys.addaudithook(hold_the_start)
box = {}
starting = threading.Thread(target=lambda: box.update(pool=pfb.ProcessPool(1, name="started")))
starting.start()
in_start.wait()
outcome = "no KeyboardInterrupt"
try:
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
except KeyboardInterrupt:
    outcome = "interrupted"
starting.join()
assert outcome == "interrupted", outcome
assert spawn.spawner.descriptors.acquire(blocking=False), "the fork left the lock held"
spawn.spawner.descriptors.release()
box["pool"].close()
with pfb.ProcessPool(1, name="after") as pool:  # a start after it takes the lock
    pool.pids()
print("done")
