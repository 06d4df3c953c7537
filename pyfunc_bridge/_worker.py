"""The worker process of a ProcessPool (pyfunc_bridge/_process.py), and what
both sides of the pool share: the frames on the socket and the arena
allocator.

Run as a script (``python <this file> SOCKET_FD INPUT_FD RESULT_FD``), never
as ``-m pyfunc_bridge._worker``: importing the package would import
TensorFlow, which a worker never needs.  At module level it imports the
standard library only; NumPy, cloudpickle (through pickle) and the user's
function load in ``main``.

The protocol, one length-prefixed pickle per frame:

* parent -> worker, first: ``{"path": sys.path, "input_bytes": n,
  "result_bytes": n, "name": pool name}``;
* worker -> parent, first: ``("ready", pid)``;
* then parent -> worker: ``(freed, forget, requests)``, every request that was
  waiting when the parent wrote: ``freed`` are result blocks the parent's
  tensors no longer hold, ``forget`` function tokens the parent dropped, and
  each request ``(call_id, token, pickled_function or None, framework,
  args, writable)``;
* worker -> parent: ``("done", replies, freed_inputs)``, one reply
  ``(call_id, ok, payload, bytes_out, (started, finished))`` per request of
  the frame it answers, and the input blocks that nothing in this worker
  refers to any more (see below).  ``(started, finished)``: the
  ``time.monotonic()`` of the call's start and end here, for the parent's
  statistics (a trailing field: a reply read by its first four still reads).

An argument or a result is ``("s", offset, size, dtype, shape)`` (numbers in
an arena: the parent's input arena, or this worker's result arena) or
``("v", value)`` (pickled: strings, NumPy scalars, Python values, and arrays
that did not fit).

Who owns a block: an input block is the parent's until it writes the request
that carries it, then this worker's until the worker reports it in
``freed_inputs``: when the last array (or torch tensor) that views it goes,
which is when the call returns unless the function kept its input (a cache,
an accumulator).  A result block is this worker's until the reply that
carries it, then the parent's until it comes back in ``freed``.
"""
import bisect
import math
import os
import socket
import struct
import sys
import time
import weakref

ALIGN = 64  # PFB_TENSOR_ALIGNMENT (src/bridge_abi.h): TF's Eigen kernels need it
_HEADER = struct.Struct("<Q")
_PICKLE_PROTOCOL = 5


class Arena:
    """First-fit allocator of ALIGN-aligned blocks in ``[0, size)``.

    One side of the pool allocates in each arena (the parent in the input
    arena, each worker in its result arena); frees come back by message."""

    def __init__(self, size):
        self.size = size
        self._free = [(0, size)] if size > 0 else []  # (offset, size), by offset

    def alloc(self, nbytes):
        """(offset, size) of a free block of at least `nbytes`, or None."""
        need = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        for i, (offset, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[i]
                else:
                    self._free[i] = (offset + need, size - need)
                return offset, need
        return None

    def free(self, offset, size):
        """Returns a block; neighbours merge."""
        blocks = self._free
        lo = bisect.bisect_left(blocks, (offset,))  # the first block at or after it
        if lo < len(blocks) and offset + size == blocks[lo][0]:
            size += blocks[lo][1]
            del blocks[lo]
        if lo > 0 and blocks[lo - 1][0] + blocks[lo - 1][1] == offset:
            offset = blocks[lo - 1][0]
            size += blocks[lo - 1][1]
            lo -= 1
            del blocks[lo]
        blocks.insert(lo, (offset, size))

    def free_bytes(self):
        return sum(size for _, size in self._free)


def frame(obj, dumps):
    """One frame: the length, then the pickle."""
    data = dumps(obj, protocol=_PICKLE_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class FrameReader:
    """Splits what a socket delivers into frames (several per read when the
    other side wrote several).  Reads into one reused buffer: a fresh large
    buffer per read would cost page faults on every call."""

    def __init__(self, sock, size=1 << 16):
        self._sock = sock
        self._buffer = bytearray(size)
        self._start = 0   # the first byte not yet parsed
        self._end = 0     # the end of what was received

    def read(self, loads):
        """The frames of the next read, at least one; [] at end of stream."""
        frames = []
        while not frames:
            if self._end == len(self._buffer):
                self._make_room()
            with memoryview(self._buffer) as view:
                received = self._sock.recv_into(view[self._end:])
                if not received:
                    return []
                self._end += received
                while self._end - self._start >= _HEADER.size:
                    (length,) = _HEADER.unpack_from(view, self._start)
                    begin = self._start + _HEADER.size
                    if self._end < begin + length:
                        break
                    frames.append(loads(view[begin:begin + length]))
                    self._start = begin + length
            if self._start == self._end:
                self._start = self._end = 0
        return frames

    def _make_room(self):
        """Moves the partial frame to the front, growing the buffer for a
        frame larger than it."""
        pending = self._end - self._start
        if self._start == 0:
            self._buffer.extend(bytes(len(self._buffer)))
        else:
            self._buffer[:pending] = self._buffer[self._start:self._end]
            self._start, self._end = 0, pending


# ----------------------------------------------------------------- worker --

def _shares_by_memory(np, dtype):
    """Whether arrays of `dtype` travel through an arena (numbers only: the
    parent converts strings and checks every other dtype itself)."""
    kind = dtype.kind
    if kind in "biufc":
        return dtype.isnative or dtype.itemsize == 1
    return (kind == "V" and dtype.names is None
            and dtype.type.__module__.startswith("ml_dtypes"))  # bfloat16, ...


def _as_numpy(np, value, framework):
    """A framework's array as an ndarray (the parent takes NumPy values)."""
    if framework == "torch" and type(value).__module__.startswith("torch"):
        import torch
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().resolve_conj().resolve_neg().numpy()
    if framework == "jax" and hasattr(value, "__array__") and hasattr(value, "__dlpack__"):
        return np.asarray(value)
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return value


def _wrap_input(np, arr, framework):
    if framework == "torch" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import torch
        return torch.from_numpy(arr)
    if framework == "jax" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import jax.numpy as jnp
        return jnp.asarray(arr)
    return arr


class _Worker:
    def __init__(self, sock, np, input_map, result_map, result_bytes):
        self.sock = sock
        self.np = np
        self.input_map = input_map
        self.results = np.frombuffer(result_map, np.uint8) if result_map else None
        self.arena = Arena(result_bytes)
        self.functions = {}  # token -> function
        # id(weak reference) -> (the reference, offset, size) of each input
        # block something here still views; the reference's callback moves
        # the block to `inputs_freed`, which the next reply carries.
        self.input_blocks = {}
        self.inputs_freed = []

    def input_block(self, offset, size):
        """A uint8 ndarray over one input block, the base of every view of it.

        Its own base is not an ndarray (np.frombuffer makes a memoryview), so
        NumPy stops collapsing views' bases at it: every view, view of a view
        and torch tensor made from one keeps it alive, and its weak reference's
        callback runs when the last of them goes, whenever that is."""
        block = self.np.frombuffer(self.input_map, self.np.uint8, count=size, offset=offset)
        ref = weakref.ref(block, self._input_gone)
        self.input_blocks[id(ref)] = (ref, offset, size)
        return block

    def _input_gone(self, ref):
        _, offset, size = self.input_blocks.pop(id(ref))
        self.inputs_freed.append((offset, size))

    def arg(self, item, writable, framework):
        if item[0] == "v":
            return item[1]
        _, offset, size, dtype, shape = item
        arr = self.input_block(offset, size).view(dtype)[:math.prod(shape)].reshape(shape)
        # The block is this call's own copy: written only under copy=True,
        # as the bridge's inputs are, and by torch (which has no read-only tensors).
        if not writable and framework != "torch":
            arr.flags.writeable = False
        return _wrap_input(self.np, arr, framework)

    def result(self, value, framework):
        """(encoded value, bytes written to the result arena)."""
        np = self.np
        value = _as_numpy(np, value, framework)
        if (isinstance(value, np.ndarray) and value.size
                and _shares_by_memory(np, value.dtype)):
            block = self.arena.alloc(value.nbytes)
            if block is not None:
                offset, size = block
                out = self.results[offset:offset + value.nbytes].view(value.dtype)
                np.copyto(out.reshape(value.shape), value, casting="no")
                return ("s", offset, size, value.dtype, value.shape), value.nbytes
        return ("v", value), 0

    def run(self, request):
        call_id, token, pickled, framework, args, writable = request
        try:
            func = self.functions.get(token)
            if func is None:
                import pickle
                func = self.functions[token] = pickle.loads(pickled)
            values = [self.arg(a, writable, framework) for a in args]
            result = func(*values)
            moved = 0
            if isinstance(result, (list, tuple)):
                items = []
                for value in result:
                    item, n = self.result(value, framework)
                    items.append(item)
                    moved += n
                payload = ("list" if isinstance(result, list) else "tuple", items)
            else:
                item, moved = self.result(result, framework)
                payload = ("one", item)
            return (call_id, True, payload, moved)
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            return (call_id, False, _exception_payload(exc), 0)

    def serve(self, reader, frames):
        """Runs requests until the end of the stream; `frames`: those read
        with the hello."""
        import pickle
        while True:
            if not frames:
                frames = reader.read(pickle.loads)
                if not frames:
                    return  # the parent closed the pool, or exited
            replies = []
            for freed, forget, requests in frames:
                for offset, size in freed:
                    self.arena.free(offset, size)
                for token in forget:
                    self.functions.pop(token, None)
                for request in requests:
                    started = time.monotonic()  # the parent's statistics
                    reply = self.run(request)
                    replies.append(reply + ((started, time.monotonic()),))
            frames = None
            self.sock.sendall(self.sendable(replies, pickle))

    def sendable(self, replies, pickle):
        """The frame of `replies`, with the input blocks freed since the last
        one (the calls' inputs, unless a function kept them).  A reply whose
        result does not pickle becomes its call's TypeError (its arena blocks
        freed), rather than an error that ends this worker and fails every
        call of the frame."""
        freed = self.freed_inputs()
        try:
            return frame(("done", replies, freed), pickle.dumps)
        except Exception:  # noqa: BLE001 - found reply by reply below
            pass
        checked = []
        for reply in replies:
            call_id, ok, payload = reply[:3]
            try:
                pickle.dumps(reply, protocol=_PICKLE_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - the call's error
                kind, body = payload
                items = [body] if kind == "one" else body
                for item in items:
                    if item[0] == "s":
                        self.arena.free(item[1], item[2])
                bad = next(i for i, item in enumerate(items) if not _pickles(pickle, item))
                error = TypeError(
                    f"pyfunc_bridge: result {bad} of the function (a "
                    f"{type(items[bad][1]).__name__}) cannot be sent back from the worker "
                    f"process: {type(exc).__name__}: {exc}. Return NumPy arrays or values "
                    f"that pickle, or run the function in-process (executor=None)")
                reply = (call_id, False, _exception_payload(error), 0) + reply[4:]
            checked.append(reply)
        return frame(("done", checked, freed), pickle.dumps)

    def freed_inputs(self):
        """Takes the input blocks reported gone since the last call."""
        freed = self.inputs_freed[:]
        del self.inputs_freed[:len(freed)]  # a callback may append meanwhile
        return freed


def _pickles(pickle, value):
    try:
        pickle.dumps(value, protocol=_PICKLE_PROTOCOL)
    except Exception:  # noqa: BLE001 - any failure: it does not
        return False
    return True


def _exception_payload(exc):
    """(pickled exception or None, builtin base class name, summary, traceback).

    cloudpickle, not pickle: a class that came by value (its module imports
    TensorFlow, so this worker has not imported it) goes back by value, where
    pickle would import its module here to look the class up by name."""
    import pickle
    import traceback

    import cloudpickle
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    base = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins")
    try:
        data = cloudpickle.dumps(exc, protocol=_PICKLE_PROTOCOL)
        pickle.loads(data)  # one that cannot be rebuilt is sent by its base class
    except Exception:  # noqa: BLE001
        data = None
    return data, base, summary, text


def _batch_policy():
    """Runs this worker under SCHED_BATCH where there is one: a batch process
    does not preempt the thread that wakes it.  Without it, a parent thread
    that had just written a request was preempted by the worker it woke, on
    its own core, holding the GIL, so no other call's request or reply moved
    until the function returned: the two workers then ran one at a time
    (~960 elements/s instead of ~1250 in the gil_bound map, for whole runs)."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass  # refused (a seccomp policy): the default policy works, more slowly


def main(argv):
    import mmap
    import signal
    # Ctrl-C reaches the whole process group: the parent decides when
    # workers end (it closes the socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock_fd, input_fd, result_fd = (int(a) for a in argv[1:4])
    sock = socket.socket(fileno=sock_fd)
    import pickle
    reader = FrameReader(sock)
    frames = reader.read(pickle.loads)  # the hello, maybe requests already
    if not frames:
        return 0
    hello = frames.pop(0)
    # The parent's imports must resolve here as there (its sys.path; the
    # working directory is inherited).
    sys.path[:] = hello["path"]
    _batch_policy()
    import numpy as np
    maps = []
    for fd, size in ((input_fd, hello["input_bytes"]), (result_fd, hello["result_bytes"])):
        maps.append(mmap.mmap(fd, size) if size else None)
        if fd >= 0:
            os.close(fd)
    worker = _Worker(sock, np, maps[0], maps[1], hello["result_bytes"])
    try:
        sock.sendall(frame(("ready", os.getpid()), pickle.dumps))
        worker.serve(reader, frames)
    except ConnectionError:
        pass  # the pool closed (maybe before this worker was ready), or the parent is gone
    return 0


if __name__ == "__main__":
    # Not the package directory (this script's): the parent's path replaces it.
    del sys.path[0]
    sys.exit(main(sys.argv))
