"""Process workers: what a pool leaves behind. A dropped pool is
collected, a closed one leaves no shared memory, a dead worker's socket and
mappings close when its death is handled, and large frames leave no buffer."""
import gc
import socket
import threading

import tensorflow as tf

import process_functions as pf
from conftest import wait_for
from pool_checks import memfds_of
import pyfunc_bridge as pfb
from process_pool_helpers import open_sockets, run_script


# A pool that its user drops without close() (executor=pfb.ProcessPool()
# inline) is collected, and its collection ends its workers and reader
# threads.  Waits for states, by pid, with the script's timeout.
_DROPPED_POOL_SCRIPT = r"""
import gc, threading, time, weakref
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import worker_alive as alive

def until(condition, what):
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)

pool = pfb.ProcessPool(2, name="dropped pool")
# Both paths: an eager call (Python's), a tf.data map (the kernel's rings).
pfb.numpy_function(pf.pid, [tf.constant(0)], tf.int64, executor=pool)
ds = tf.data.Dataset.range(20).map(
    lambda x: pfb.numpy_function(pf.plus_one, [x], tf.int64, executor=pool))
assert list(ds.as_numpy_iterator()) == list(range(1, 21))
pids = pool.pids()
ref = weakref.ref(pool)
del pool, ds
gc.collect()
assert ref() is None, gc.get_referrers(ref())
until(lambda: not [p for p in pids if alive(p)], f"workers {pids} of a dropped pool still run")
until(lambda: not [t for t in threading.enumerate() if t.name.startswith("dropped pool")],
      "the dropped pool's threads still run")
print("done")
"""


def test_a_pool_dropped_without_close_is_collected_and_ends_its_workers():
    run_script(_DROPPED_POOL_SCRIPT)

def test_a_closed_pool_leaves_no_shared_memory_in_this_process():
    name = "memfd check pool"
    with pfb.ProcessPool(1, arena_bytes=1 << 20, name=name) as pool:
        out = pfb.numpy_function(pf.identity, [tf.range(1000.0)], tf.float32, executor=pool)
        fds, maps = memfds_of(name)
        # (control: each worker's rings, src/pool/shm_layout.h)
        assert fds and {"inputs", "results", "control"} == {m.split("-")[-1].split()[0]
                                                            for m in maps}
        assert int(out[999]) == 999
    # The result tensor still holds its block: the results mapping outlives close().
    assert any("-results" in m for m in memfds_of(name)[1])
    assert int(out[999]) == 999
    del out, pool
    gc.collect()
    assert memfds_of(name) == ([], [])


def test_close_unmaps_the_shared_memory_of_a_pool_still_referenced():
    """close() frees the arenas although the pool object lives on; a result
    tensor keeps only its own worker's mapping, until it goes."""
    name = "unmap check pool"
    sockets = open_sockets()
    pool = pfb.ProcessPool(2, arena_bytes=1 << 20, name=name)
    try:
        kept = pfb.numpy_function(pf.identity, [tf.range(1000.0)], tf.float32,
                                  executor=pool)
        # The input arena, two result arenas and two control segments (each
        # mmap object holds a descriptor of its own, and the pool the input
        # arena's), and the native dispatcher's own mappings of the three
        # arenas (src/pool/dispatch.h: they outlive Python's while a kernel
        # or a tensor needs them).
        wait_for(lambda: len(memfds_of(name)[1]) == 8)  # both workers attached
        fds, maps = memfds_of(name)
        assert len(fds) == 6 and len(maps) == 8, (fds, maps)
    finally:
        pool.close()
    fds, maps = memfds_of(name)
    # The dispatcher's mapping of the result's arena (no descriptor).
    assert fds == [] and len(maps) == 1 and "-results" in maps[0], (fds, maps)
    assert int(kept[999]) == 999
    del kept  # (no gc.collect: nothing waits for a collection)
    assert memfds_of(name) == ([], [])
    assert open_sockets() <= sockets  # the workers' sockets closed too


# With gc off, in a fresh interpreter: what a dead worker leaves must go when
# its death is handled, not when a collection finds it.
_DEATHS_SCRIPT = r"""
import gc, os, signal, time
gc.disable()
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
import pool_checks as t
from conftest import wait_for
with pfb.ProcessPool(1, arena_bytes=1 << 20, name="dying pool") as pool:
    def call():
        return float(pfb.numpy_function(pf.double, [tf.fill([1000], 2.0)], tf.float32,
                                        executor=pool)[0])
    assert call() == 4.0
    fds, maps = len(t.descriptors("socket:", "/memfd:")), len(t.memfds_of("dying pool")[1])
    for _ in range(10):
        (victim,) = pool.pids()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pool.pids() not in ([], [victim]))  # replaced
        assert call() == 4.0  # (waits for the new worker to be ready)
    wait_for(lambda: len(t.descriptors("socket:", "/memfd:")) == fds)
    assert len(t.memfds_of("dying pool")[1]) == maps, (t.memfds_of("dying pool")[1], maps)
print("done")
"""


def test_a_dead_workers_socket_and_mapping_are_closed_when_its_death_is_handled():
    run_script(_DEATHS_SCRIPT)


_ROUND_TRIP_SCRIPT = r"""
import gc, os
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf

def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))

with pfb.ProcessPool(1, name="round trip pool") as pool:  # 64 MiB arenas: 200 MiB is pickled
    (pid,) = pool.pids()
    pfb.numpy_function(pf.identity, [tf.constant(1)], tf.int32, executor=pool)
    x = tf.fill([50 << 20], 1.0)  # 200 MiB
    before = rss_mib(pid), rss_mib(os.getpid())
    for _ in range(2):
        out = pfb.numpy_function(pf.double, [x], tf.float32, executor=pool)
        assert float(out[-1]) == 2.0
        del out
    after = rss_mib(pid), rss_mib(os.getpid())
    # Nothing of 200 MiB frames stays: no buffer, no reply kept.
    assert after[0] < before[0] + 32 and after[1] < before[1] + 64, (before, after)
print("done")
"""


def test_a_large_round_trip_leaves_no_large_buffer_behind():
    run_script(_ROUND_TRIP_SCRIPT)


def test_frames_larger_than_the_reader_buffer_arrive_whole():
    """FrameReader: small frames share its buffer, a large one gets its own,
    in any split of the stream."""
    import pickle
    from pyfunc_bridge.worker import frames as _worker
    a, b = socket.socketpair()
    b.settimeout(20)  # a frame that never completes fails the test
    try:
        reader = _worker.FrameReader(b, size=64)
        sent = [b"x" * 10, b"y" * 1000, b"z" * 20, list(range(300)), b"w"]
        writer = threading.Thread(target=lambda: [_worker.send(a, pickle.dumps(item))
                                                  for item in sent])
        writer.start()
        got = []
        while len(got) < len(sent):
            got.extend(reader.read(pickle.loads))
        writer.join()
        assert got == sent  # (no large buffer stays: the large round trip test)
        a.close()
        assert reader.read(pickle.loads) == []
    finally:
        a.close()
        b.close()
