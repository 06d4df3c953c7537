"""A pool worker serves its request ring (issue 19, stage 1): CALLs that
name their inputs by tensor records over the pool's input arena are run and
answered by DONEs over the worker's result arena, the input blocks come back
in INPUTS_BACK when nothing in the worker views them, result blocks are
freed by RESULTS_BACK, functions arrive by LOAD, errors come back pickled.
The test plays the parent's native side with the pool's own Channel and
input allocator; the worker is a real pool worker.

The pool's native dispatcher (src/pool/dispatch_*.c) is kept out of these
tests' pools; tests/pool/test_pool_dispatch.py runs it against real workers."""
import mmap
import pickle
import struct
import time

import numpy as np
import pytest

import pyfunc_bridge as pfb
from pyfunc_bridge.pool import pickling as _pickling
from pyfunc_bridge.pool.errors import worker_exception
from pyfunc_bridge.pool.supervision import Supervisor
from pyfunc_bridge.worker import compiled as _worker

pw = _worker.pool_module()
R, Q = pw.REQUESTS, pw.REPLIES
CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
SCALAR = 1 << 20


class Client:
    """The parent's native side of one worker, in Python: allocates input
    blocks in the pool's input arena, posts requests, reads replies."""

    def __init__(self, pool):
        self.pool = pool
        self.worker = pool._supervisor.workers[0]
        deadline = time.monotonic() + 60
        while not self.worker.ready:  # (its "ready" comes once it serves its ring)
            assert time.monotonic() < deadline, "the worker never served its ring"
            time.sleep(0.01)
        self.channel = self.worker.channel
        # The input arena's allocator: this test's own (the pool's dispatcher,
        # never attached here, allocates nothing), the arena allocator of a
        # result arena over a mapping of the same size.
        self.arena = pw.ResultArena(mmap.mmap(-1, len(pool._input_map)))
        self.inputs = np.frombuffer(pool._input_map, np.uint8)
        self.results = np.frombuffer(self.worker.result_map, np.uint8)
        self.held = {}       # input offset -> size, until INPUTS_BACK
        self.returned = []   # input offsets that came back
        self.done = {}       # call id -> DONE message
        self.order = []      # ("done", call id) and ("back", offset), as read
        self.ids = iter(range(1, 1 << 30))
        self.tokens = iter(range(SCALAR, 1 << 30))

    def block(self, data):
        offset, size = self.arena.reserve(max(len(data), 1))
        self.inputs[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
        self.held[offset] = size
        return offset, size

    def load(self, func):
        token = next(self.tokens)
        data = pickle.dumps((None, _pickling.dumps(func, 5)))
        offset, _ = self.block(data)
        assert self.channel.post(R, pw.MSG_LOAD, token=token, block=(offset, len(data)),
                                 timeout=30)
        return token

    def tensor(self, value):
        value = np.asarray(value)
        if value.dtype.kind in "SO":
            data = b"".join(struct.pack("<Q", len(s)) + s for s in value.ravel().tolist())
            offset, size = self.block(data) if data else (0, 0)
            return (0, 0, 0, pw.TENSOR_STRINGS, offset, len(data), value.shape)
        data = np.ascontiguousarray(value).tobytes()
        offset, size = self.block(data) if data else (0, 0)
        return (CODES[value.dtype.kind], value.dtype.itemsize * 8, 1, 0, offset,
                len(data), value.shape)

    def call(self, token, *args, flags=0):
        call_id = next(self.ids)
        records = [self.tensor(a) for a in args]
        self.last_inputs = [r[4] for r in records if r[5]]
        assert self.channel.post(R, pw.MSG_CALL, records,
                                         call_id=call_id, token=token, flags=flags,
                                         stamp=time.time_ns(), timeout=30)
        return call_id

    def notify(self):
        return self.channel.notify(R)

    def read(self, timeout=30):
        """Reads replies until none is there (waits for the first)."""
        assert self.channel.wait(Q, timeout=timeout), "no reply"
        for message in self.channel.receive(Q):
            if message.kind == pw.MSG_DONE:
                self.done[message.call_id] = message
                self.order.append(("done", message.call_id))
            else:
                assert message.kind == pw.MSG_INPUTS_BACK
                for offset in message.items:
                    size = self.held.pop(offset)  # KeyError: a block not in flight
                    self.arena.hand_back(offset)
                    self.returned.append(offset)
                    self.order.append(("back", offset))

    def result(self, call_id, timeout=30):
        deadline = time.monotonic() + timeout
        while call_id not in self.done:
            self.read(max(0.0, deadline - time.monotonic()))
        return self.done.pop(call_id)

    def values(self, done):
        """The DONE's outputs, copied out; its result blocks handed back."""
        out, blocks = [], []
        results = self.results
        for code, bits, lanes, flags, offset, size, shape in done.items:
            data = results[offset:offset + size]
            if flags & pw.TENSOR_PICKLED:
                out.append(pickle.loads(data.tobytes()))
            else:
                kind = {v: k for k, v in CODES.items()}[code]
                dtype = np.dtype(f"{kind}{bits // 8}")
                count = int(np.prod(shape))
                out.append(data.view(dtype)[:count].reshape(shape).copy())
            blocks.append(offset)
        if blocks:
            self.channel.post(R, pw.MSG_RESULTS_BACK, blocks, timeout=30)
            self.notify()
        return out


@pytest.fixture
def client(monkeypatch):
    # This test is the rings' parent side: the pool's own dispatcher, whose
    # reply thread would be a second consumer of the reply ring, stays out.
    monkeypatch.setattr(Supervisor, "attach", lambda self, worker: None)
    with pfb.ProcessPool(1, arena_bytes=16 << 20, name="ring-worker") as pool:
        yield Client(pool)


def double(a):
    return a * 2


def test_a_call_runs_and_its_fresh_result_is_shared_without_a_copy(client):
    token = client.load(double)
    x = np.arange(1 << 14, dtype=np.float64)  # 128 KiB: NumPy allocates it in the arena
    call_id = client.call(token, x)
    client.notify()
    done = client.result(call_id)
    assert done.status == pw.STATUS_OK and done.flags == pw.DONE_ONE
    [(code, bits, _, flags, offset, size, shape)] = done.items
    assert (code, bits, shape) == (2, 64, x.shape) and flags & pw.TENSOR_SHARED
    assert done.stamp <= done.ended
    [y] = client.values(done)
    np.testing.assert_array_equal(y, x * 2)
    # The input came back once the worker let go of it; the result block,
    # handed back, serves the next call (first fit).
    while client.held:
        client.read()
    again = client.result(_call_and_notify(client, token, x))
    assert again.items[0][4] == offset
    client.values(again)


def _call_and_notify(client, token, *args, flags=0):
    call_id = client.call(token, *args, flags=flags)
    client.notify()
    return call_id


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16",
                                   "uint32", "uint64", "float16", "float32", "float64",
                                   "complex64", "complex128", "bool"])
def test_every_dtype_round_trips(client, dtype):
    token = client.load(lambda a: a[::-1].copy())
    x = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    [y] = client.values(client.result(_call_and_notify(client, token, x)))
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x[::-1])


def test_zero_d_empty_strings_and_containers(client):
    token = client.load(lambda a, b, s: (a + 1, b, [v.upper() for v in s.ravel()],
                                         np.float32(2.5)))
    a = np.array(41, dtype=np.int64)
    b = np.zeros((0, 3), np.float32)
    s = np.array([b"ab", b"", b"xyz\x00"], dtype=object)
    done = client.result(_call_and_notify(client, token, a, b, s))
    assert done.status == pw.STATUS_OK and done.flags == pw.DONE_TUPLE
    out = client.values(done)
    assert out[0] == 42 and out[0].shape == ()
    assert out[1].shape == (0, 3) and out[1].dtype == np.float32
    assert out[2] == [b"AB", b"", b"XYZ\x00"]
    # A NumPy scalar travels as memory, a 0-d record (the parent's kernel
    # takes it without Python); in-process it converts to the same tensor.
    assert out[3] == 2.5 and out[3].dtype == np.float32 and out[3].shape == ()


def test_scalars_flag_gives_numpy_scalars_and_inputs_are_read_only(client):
    token = client.load(lambda a, b: (type(a).__name__, b.flags.writeable))
    arr = np.ones(3)
    out = client.values(client.result(_call_and_notify(client, token, np.float64(1), arr,
                                                       flags=pw.CALL_SCALARS)))
    assert out == ["float64", False]
    out = client.values(client.result(_call_and_notify(
        client, token, np.float64(1), arr, flags=pw.CALL_WRITABLE)))
    assert out == ["ndarray", True]


def test_an_error_comes_back_pickled_with_its_traceback(client):
    def fails(a):
        raise KeyError(f"no {a.sum()}")
    token = client.load(fails)
    done = client.result(_call_and_notify(client, token, np.ones(2)))
    assert done.status == pw.STATUS_ERROR and done.items == []
    offset, size = done.block
    payload = pickle.loads(client.results[offset:offset + size].tobytes())
    exc = worker_exception(payload)
    assert isinstance(exc, KeyError) and "no 2.0" in str(exc)
    assert "fails" in str(exc.__cause__)
    client.channel.post(R, pw.MSG_RESULTS_BACK, [offset], timeout=30)
    # A token never loaded: the call fails, the worker serves on.
    done = client.result(_call_and_notify(client, 999, np.ones(2)))
    assert done.status == pw.STATUS_ERROR
    token = client.load(double)
    [y] = client.values(client.result(_call_and_notify(client, token, np.ones(2))))
    np.testing.assert_array_equal(y, [2, 2])


kept = []


def keep(a, clear):
    """Keeps its input, or (clear) lets go of every one it kept.  One
    function: this module imports TensorFlow, so its functions travel by
    value, each with its own copy of `kept`."""
    if clear:
        kept.clear()
    else:
        kept.append(a)
    return a.sum()


def test_a_kept_input_comes_back_only_when_the_function_lets_go(client):
    token = client.load(keep)
    x = np.arange(1000, dtype=np.int64)
    no, yes = np.array(False), np.array(True)
    first = _call_and_notify(client, token, x, no)
    kept_offset = client.last_inputs[0]
    [total] = client.values(client.result(first))
    assert total == x.sum()
    for _ in range(3):
        client.values(client.result(_call_and_notify(client, token, x[:1], no)))
    assert kept_offset in client.held and kept_offset not in client.returned  # the worker's
    client.values(client.result(_call_and_notify(client, token, x[:1], yes)))
    deadline = time.monotonic() + 30
    while kept_offset not in client.returned:
        assert time.monotonic() < deadline
        client.read()


def identity(a):
    return a


@pytest.mark.parametrize("func", [identity, double], ids=["returned", "let_go"])
def test_inputs_a_call_let_go_of_come_back_before_its_done(client, func):
    """The input blocks a call let go of go back in INPUTS_BACK ahead of its
    DONE, on the same ring: when the parent sees the call done, the blocks
    are free (a caller that finds no room can tell kept blocks from late
    ones), and one wake-up of the parent serves both.  An input the function
    returned is no exception: its last reference in the worker goes before
    the DONE does."""
    token = client.load(func)
    for _ in range(5):
        call_id = _call_and_notify(client, token, np.arange(100.0))
        [offset] = client.last_inputs
        client.values(client.result(call_id))
        assert ("back", offset) in client.order, "the input came back after the DONE"
        assert client.order.index(("back", offset)) < client.order.index(("done", call_id))


def test_one_doorbell_wakes_the_worker_for_a_batch_and_replies_come_in_order(client):
    """A batch posted while the worker sleeps costs one doorbell ring.  The
    worker can be seen asleep a moment before it wakes for something else
    (its socket, a ring rung while its flag was up), and then it serves the
    batch unrung: such a round only checks the replies, and the test tries
    again until one round found the worker asleep (a worker that never
    sleeps, or a batch that rings more than once, fails it)."""
    token = client.load(double)
    client.values(client.result(_call_and_notify(client, token, np.ones(2))))
    rung_once = 0
    for round_ in range(10):
        deadline = time.monotonic() + 30
        while not client.channel.consumer_sleeping(R):  # back asleep in its poll
            assert time.monotonic() < deadline, "the worker never went to sleep"
            time.sleep(0.01)
        time.sleep(0.05)  # let a wake-up already under way run out
        if not client.channel.consumer_sleeping(R):
            continue
        rung = client.channel.wakes(R)
        ids = [client.call(token, np.full(4, i)) for i in range(20)]
        if client.notify():
            assert client.channel.wakes(R) == rung + 1
            rung_once += 1
        else:
            assert client.channel.wakes(R) == rung
        for i, call_id in enumerate(ids):
            [y] = client.values(client.result(call_id))
            np.testing.assert_array_equal(y, np.full(4, 2 * i))
        if rung_once >= 2:
            break
    assert rung_once >= 2, f"the worker was asleep for {rung_once} of {round_ + 1} batches"
