"""The consumer: an echo of the request ring onto the reply ring, one reply per
request: (messages it read after that wake-up, its sleeps so far).  A
request with token 1 makes it pause words[0] ms before it reads on.

Run by tests/pool/test_pool_ring.py in a fresh interpreter
(tests/fresh_python.py)."""
import mmap, os, sys, time
sys.path.insert(0, sys.argv[1])
from worker import compiled as _worker
pw = _worker.pool_module()
assert "tensorflow" not in sys.modules and "pyfunc_bridge" not in sys.modules
fd = int(sys.argv[2])
channel = pw.Channel(mmap.mmap(fd, os.fstat(fd).st_size))
print("ready", flush=True)
R, Q = pw.REQUESTS, pw.REPLIES
while True:
    try:
        channel.wait(R, timeout=60, interruptible=False)
    except pw.ChannelClosed:
        break
    batch = channel.receive(R)
    for message in batch:
        channel.post(Q, pw.MSG_WORDS, [len(batch), channel.sleeps(R), channel.wakes(R)],
                     call_id=message.call_id, timeout=60)
    channel.notify(Q)
    for message in batch:
        if message.token == 1:
            time.sleep(message.items[0] / 1000)
