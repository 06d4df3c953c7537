"""Process workers: what a pool leaves behind. A dropped pool is
collected, a closed one leaves no shared memory, a dead worker's socket and
mappings close when its death is handled, and large frames leave no buffer."""
import gc
import socket
import threading

import pytest
import tensorflow as tf

import process_functions as pf
from conftest import wait_for
from pool_checks import memfds_of
import pyfunc_bridge as pfb
from pyfunc_bridge.worker.compiled import pool_module
from process_pool_helpers import open_sockets, run_script


# A pool that its user drops without close() (executor=pfb.ProcessPool()
# inline) is collected, and its collection ends its workers and reader
# threads.  Waits for states, by pid, with the script's timeout.
_DROPPED_POOL_SCRIPT = "pool/cleanup_dropped_pool.py"


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


def test_a_construction_interrupted_leaves_no_shared_memory(monkeypatch):
    """A Ctrl-C (or any error) while a pool is being made, after its input
    arena is, closes that arena's descriptor: nothing else would."""
    name = "interrupted construction"

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(pool_module(), "Dispatcher", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pfb.ProcessPool(1, name=name)
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
_DEATHS_SCRIPT = "pool/cleanup_deaths.py"


def test_a_dead_workers_socket_and_mapping_are_closed_when_its_death_is_handled():
    run_script(_DEATHS_SCRIPT)


_ROUND_TRIP_SCRIPT = "pool/cleanup_round_trip.py"


def test_a_large_round_trip_leaves_no_large_buffer_behind():
    run_script(_ROUND_TRIP_SCRIPT)


def test_frames_larger_than_the_reader_buffer_arrive_whole():
    """FrameReader: small frames share its buffer, a large one gets its own,
    in any split of the stream."""
    from pyfunc_bridge.worker import frames as _worker
    a, b = socket.socketpair()
    b.settimeout(20)  # a frame that never completes fails the test
    try:
        reader = _worker.FrameReader(b, size=64)
        sent = [b"x" * 10, b"y" * 1000, b"z" * 20, list(range(300)), b"w"]
        writer = threading.Thread(target=lambda: [_worker.send(a, item) for item in sent])
        writer.start()
        got = []
        while len(got) < len(sent):
            got.extend(reader.read())
        writer.join()
        assert got == sent  # (no large buffer stays: the large round trip test)
        a.close()
        assert reader.read() == []
    finally:
        a.close()
        b.close()
