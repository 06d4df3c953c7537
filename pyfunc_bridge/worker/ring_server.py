"""A worker's side of its rings: serving LOAD, CALL, RESULTS_BACK and FORGET
one at a time, and answering with DONE and INPUTS_BACK.  (A pool ends a
worker by shutting its socket.)"""
import importlib
import math
import os
import pickle
import select
import sys
import time

from .frames import PICKLE_PROTOCOL, send
from .memory import address
from .values import as_numpy, frameworks, strings_array, wrap_input

# ------------------------------------------------------------ the rings --
# CALLs name their inputs by PfbPoolTensor records over the pool's input
# arena, and DONEs their results by records over this worker's result arena,
# so a call needs no pickle.  The worker polls its socket and its doorbell
# (an eventfd the parent rings after posting, when the worker has said it
# sleeps) at once.  Dtypes travel as DLPack codes (the pool module's
# dl_dtype and np_dtype, from the one table, src/dtype_table.h).

# How long a worker that ran out of requests keeps looking at its ring
# before it sleeps: an eager caller's next call comes within tens of µs, and
# finding it awake saves the parent's doorbell and a 20-50 µs wake-up here.
SPIN_NS = 50_000


class RingServer:
    """A worker's side of its control segment: reads every request there
    is, runs it, and answers on the reply ring, one call at a time, on the
    worker's main thread."""

    def __init__(self, worker, pw, channel, doorbell, sock, reader):
        self.worker = worker
        self.reader = reader  # the socket's FrameReader, which pull() reads
        self.pw = pw
        self.channel = channel
        self.doorbell = doorbell  # the eventfd the parent rings
        self.sock = sock  # the worker's socket: pulls, and answers too large for the arena
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.poller.register(doorbell, select.POLLIN)
        self.functions = {}    # token -> the function its LOAD carried
        self.unloaded = {}     # token -> (sys.path, pickle) of a LOAD not unpickled yet
        self.load_errors = {}  # token -> (the exception its LOAD raised, its traceback)
        self.load_grace_ns = 0  # a pool with a timeout: see function()
        # Words per INPUTS_BACK: the dispatcher's rule (records.h).
        self.words_per_message = pw.words_per_message(channel.ring_slots)

    def run(self):
        """Serves the ring until the end of the socket's stream (the pool
        closed, or the parent died), which the socket shows while the worker
        sleeps: the parent sends nothing else unasked."""
        pw_requests = self.pw.REQUESTS
        while True:
            while self.serve():
                pass
            if self.channel.spin(pw_requests, SPIN_NS):
                continue
            if self.wait():
                if not self.reader.read():
                    return
                raise RuntimeError("pyfunc_bridge: the parent sent a message the worker "
                                   "did not ask for")

    def wait(self):
        """Sleeps until the socket or the doorbell has something; whether
        the socket has (the ring is read anyway, next)."""
        requests = self.pw.REQUESTS
        try:
            # Requests that came while the flag went up are read instead of
            # sleeping: a parent that saw the flag may have rung already.
            events = [] if self.channel.sleeping(requests, True) else self.poller.poll()
        finally:
            self.channel.sleeping(requests, False)
        try:
            # Reset, so that the next sleep does not wake at once for a ring
            # already served (a ring after this read wakes one sleep early:
            # harmless).
            os.eventfd_read(self.doorbell)
        except BlockingIOError:
            pass  # not rung
        return any(fd == self.sock.fileno() for fd, _ in events)

    def serve(self):
        """Runs every request on the ring now; whether there was any."""
        pw = self.pw
        messages = self.channel.receive(pw.REQUESTS)
        for message in messages:
            kind = message.kind
            if kind == pw.MSG_CALL:
                self.call(message)
                # A parent that sleeps for this reply wakes now; one that is
                # awake costs this one load of its flag.
                self.channel.notify(pw.REPLIES)
            elif kind == pw.MSG_LOAD:
                self.load(message)
            elif kind == pw.MSG_RESULTS_BACK:
                for offset in message.items:
                    self.worker.arena.hand_back(offset)
            elif kind == pw.MSG_FORGET:
                for token in message.items:
                    self.functions.pop(token, None)
                    self.unloaded.pop(token, None)
                    self.load_errors.pop(token, None)
        if messages:
            self.inputs_back()
        return bool(messages)

    def inputs_back(self, notify=True):
        """Posts the ring's input blocks that nothing here views any more;
        `notify`: wake the parent's reader for them (a CALL's DONE, posted
        right after, wakes it once for both)."""
        freed = self.worker.inputs_freed
        taken = freed[:]
        del freed[:len(taken)]  # a callback may append meanwhile
        pw = self.pw
        for start in range(0, len(taken), self.words_per_message):
            self.channel.post(pw.REPLIES, pw.MSG_INPUTS_BACK,
                              taken[start:start + self.words_per_message])
        if taken and notify:
            self.channel.notify(pw.REPLIES)

    def load(self, message):
        """Keeps a LOAD's function pickled: its first CALL unpickles it
        (function), so that the pool's timeout covers its imports."""
        worker = self.worker
        offset, size = message.block
        data = None
        if not message.flags & self.pw.LOAD_SOCKET:
            try:
                data = bytes(worker.input_map[offset:offset + size])
            finally:
                worker.inputs_freed.append(offset)  # read: the parent's again
        self.functions.pop(message.token, None)
        self.load_errors.pop(message.token, None)
        try:
            self.unloaded[message.token] = (pickle.loads(data) if data is not None
                                            else self.pull(("load", message.token)))
        except BaseException as exc:  # noqa: BLE001 - each CALL of it raises it
            self.load_errors[message.token] = (exc, exc.__traceback__)

    def function(self, token, call_id):
        """The function of `token`, unpickled at its first call (with the
        sys.path of its LOAD) under a clock of the pool's timeout plus
        `load_grace_ns` (timeouts.py, LOAD_GRACE_SECONDS); the call's own
        clock starts after it.  The exception its LOAD raised, each time,
        with its own traceback (not one that grows by a call each time)."""
        if token in self.functions:
            return self.functions[token]
        error = self.load_errors.get(token)
        if error is not None:
            raise error[0].with_traceback(error[1])
        if token not in self.unloaded:
            raise RuntimeError(f"pyfunc_bridge: worker {os.getpid()} has no function "
                               f"of token {token} (no LOAD came before the CALL)")
        path, pickled = self.unloaded.pop(token)
        self.channel.set_running(call_id, time.monotonic_ns() + self.load_grace_ns)
        try:
            if path is not None:
                sys.path[:] = path
            importlib.invalidate_caches()  # modules made since the last import
            func = self.functions[token] = pickle.loads(pickled)
        except BaseException as exc:  # noqa: BLE001 - each CALL of it raises it
            self.load_errors[token] = (exc, exc.__traceback__)
            raise
        self.channel.set_running(call_id, time.monotonic_ns())
        return func

    def pull(self, payload_id):
        """What the parent keeps under `payload_id` (shm_layout.h,
        PFB_POOL_TENSOR_SOCKET: an input, or a packed CALL's inputs; a
        LOAD's function, by ("load", token)), asked for on the socket."""
        send(self.sock, ("need", payload_id))
        frames = self.reader.read()  # (at least one frame, or [] at the stream's end)
        if not frames:
            raise ConnectionResetError("pyfunc_bridge: the pool closed while the worker "
                                       "waited for a call's input")
        frame = frames[0]  # (the one: pulls come one at a time)
        if frame[0] != "payload" or frame[1] != payload_id:
            raise RuntimeError(f"pyfunc_bridge: the parent sent {frame[0]!r} for "
                               f"{frame[1]!r} while the worker waited for "
                               f"{payload_id!r}")
        if frame[2] is None:
            raise RuntimeError(f"pyfunc_bridge: the parent no longer holds "
                               f"{payload_id!r} (the call's caller stopped "
                               f"waiting, or its function was dropped)")
        return pickle.loads(frame[2])

    def args(self, message, flags):
        """The function's arguments: one per input record, or, for a packed
        CALL (PFB_POOL_CALL_PACKED), those its one pulled payload lists."""
        pw = self.pw
        if flags & pw.CALL_PACKED:
            (record,) = message.items
            return [self.pulled(self.worker.pulled_input(value), flags)
                    for value in self.pull(record[4])]
        return [self.arg(t, flags) for t in message.items]

    def pulled(self, value, flags):
        """An input (pulled over the socket, or a block's numbers) as the
        function gets it: writable or not as _inputs_writable says; 0-d a
        NumPy scalar under PFB_POOL_CALL_SCALARS.  A value the records
        cannot describe stays as it came."""
        pw, np = self.pw, self.worker.np
        if not isinstance(value, np.ndarray):
            return value
        if _inputs_writable(pw, flags):
            if not value.flags.writeable:
                value = value.copy()
        else:
            value.flags.writeable = False
        if flags & pw.CALL_SCALARS and value.ndim == 0:
            return value[()]
        return value

    def arg(self, tensor, flags):
        pw, worker = self.pw, self.worker
        np = worker.np
        code, bits, lanes, tflags, offset, size, shape = tensor
        if tflags & pw.TENSOR_SOCKET:
            return self.pulled(worker.pulled_input(self.pull(offset)), flags)
        if tflags & pw.TENSOR_STRINGS:
            block = worker.input_block(offset, size) if size else b""
            arr = strings_array(np, memoryview(block), shape)
            del block  # decoded: the block goes back
            return arr[()] if flags & pw.CALL_SCALARS and arr.ndim == 0 else arr
        dtype = pw.np_dtype(code, bits)
        count = math.prod(shape)
        if not count or not size:
            return self.pulled(np.zeros(shape, dtype), flags)
        if count * dtype.itemsize > size:
            raise ValueError(f"pyfunc_bridge: an input of shape {shape} does not "
                             f"fit its {size}-byte block")
        return self.pulled(worker.input_block(offset, size).view(dtype)[:count].reshape(shape),
                           flags)

    def call(self, message):
        pw, worker = self.pw, self.worker
        np = worker.np
        started = time.time_ns()
        self.channel.set_running(message.call_id, time.monotonic_ns())
        flags = message.flags
        framework = pw.FLAG_FRAMEWORKS.get(flags & pw.CALL_FRAMEWORKS)
        tensors = []
        shape_kind = pw.DONE_ONE
        status, block = pw.STATUS_OK, (0, 0)
        try:
            # The inputs first: raised for, they go back with the DONE.
            args = self.args(message, flags)
            # Their memory (blocks or pulled), which a DLPack producer's copy
            # facts take for TensorFlow's, as in-process; no reference kept.
            ranges = [(address(a), address(a) + a.nbytes) for a in args
                      if isinstance(a, np.ndarray) and a.dtype.kind != "O"] if (
                flags & pw.CALL_FACTS and framework is not None) else ()
            values = [wrap_input(np, v, framework) for v in args]
            del args
            func = self.function(message.token, message.call_id)
            result = worker.arena.call(func, values)
            if framework == "torch" and not flags & pw.CALL_WRITABLE:
                # In-process the tensors are TensorFlow's memory, and a write
                # to one fails the call (the adapter sees it): here too,
                # though the blocks are this call's own.
                frameworks().adapter("torch").check_inputs(values)
            del values  # the inputs are no longer the worker's, as in-process
            # The copy facts (copy=False), before any reference is taken to the results.
            outside = sys.getrefcount(result) - 2  # `result` and getrefcount's argument
            if type(result) is tuple:
                shape_kind, items = pw.DONE_TUPLE, result
            elif type(result) is list:
                shape_kind, items = pw.DONE_LIST, tuple(result)
            else:
                items = (result,)
            facts = [None] * len(items)
            if flags & pw.CALL_FACTS:
                read_only = not _inputs_writable(pw, flags)
                # Each result's references the worker does not hold (a list's or
                # tuple's items counted before any reference is taken to them).
                counts = ([outside] if shape_kind == pw.DONE_ONE
                          else pw.outside_refs(items, result, outside))
                facts = [worker.one_facts(value, n, read_only, framework, ranges)
                         for value, n in zip(items, counts)]
            try:
                for index, (value, value_facts) in enumerate(zip(items, facts)):
                    tensors.append(self.encode(value, framework, value_facts, index))
                if not self.channel.fits(tensors):
                    raise _NoRoom
            except _NoRoom:  # the whole answer goes by the socket, as NumPy values
                self.hand_back_tensors(tensors)
                tensors = []
                # (As a list: the parent shapes it as the DONE's flags say.)
                converted = [as_numpy(np, value, framework, i) for i, value in enumerate(items)]
                status = self.by_socket(message.call_id, True, _pickled(converted), facts)
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            self.hand_back_tensors(tensors)
            tensors = []
            status = pw.STATUS_ERROR
            payload = _pickled(_exception_payload(exc))
            block = self.place(payload)
            if block is None:
                status, block = self.by_socket(message.call_id, False, payload, None), (0, 0)
        finally:
            # The last references here to inputs the function returned (the
            # loop's `value` too), so that their blocks go with this DONE.
            result = items = converted = values = value = None
        try:
            # The inputs it let go of go back before its DONE: a caller that sees
            # the call done and no room can then tell kept blocks from late ones.
            # Not notified apart: the DONE's notify (serve) wakes the parent once
            # for both, so a caller that reads its own DONE wakes once.
            self.inputs_back(notify=False)
            self.channel.post(pw.REPLIES, pw.MSG_DONE, tensors, call_id=message.call_id,
                              flags=shape_kind, status=status, block=block,
                              stamp=started, ended=time.time_ns())
        finally:
            # Only now: the call's clock covers what its end runs (a released
            # result's finalizer), so a hang there times the call out.
            self.channel.set_running(0)

    def hand_back_tensors(self, tensors):
        """Frees the result blocks of records that will not be sent."""
        for tensor in tensors:
            if tensor[5]:
                self.worker.arena.hand_back(tensor[4])

    def by_socket(self, call_id, ok, data, facts):
        """An answer the result arena has no room for, or with more records
        than the reply ring (Channel.fits), goes pickled on the socket,
        before its DONE (shm_layout.h, PFB_POOL_STATUS_SOCKET), with its
        results' copy facts."""
        send(self.sock, ("ring", call_id, ok, data, facts))
        return self.pw.STATUS_SOCKET

    def encode(self, value, framework, facts, index=0):
        """A result's tensor record, its copy facts in its flags: its block
        in the result arena (the function's own memory when the arena can
        share it, else a copy), or its pickle in a block
        (PFB_POOL_TENSOR_PICKLED).  A framework's array goes as NumPy's."""
        pw, worker = self.pw, self.worker
        np = worker.np
        fact_bits = pw.facts_flags(facts)
        record, value = worker.result(value, framework, fact_bits, index)
        if record is not None:
            return record
        # A NumPy scalar (numpy_function's usual 0-d result) is memory too:
        # its bytes in a block, so that the parent's kernel takes it without
        # Python, marked a scalar for the parent's checks (TENSOR_SCALAR).
        # (A Python number stays a value: the parent's checks convert it,
        # as in-process.)
        dl = pw.dl_dtype(value.dtype) if isinstance(value, np.generic) else None
        if dl is not None:
            data = value.tobytes()
            block = self.place(data)
            if block is not None:
                return (*dl, fact_bits | pw.TENSOR_SCALAR, block[0], len(data), ())
        try:
            data = _pickled(value)
        except Exception as exc:  # noqa: BLE001 - the call's error
            raise TypeError(
                f"pyfunc_bridge: result {index} of the function (a {type(value).__name__}) "
                f"cannot be sent back from the worker process: {type(exc).__name__}: "
                f"{exc}. Return NumPy arrays or values that pickle, or run the function "
                f"in-process (executor=None)") from None
        block = self.place(data)
        if block is None:
            raise _NoRoom  # the whole answer goes by the socket
        return (0, 0, 0, pw.TENSOR_PICKLED | fact_bits, block[0], len(data), ())

    def place(self, data):
        """(offset, size) of a fresh result block holding `data`, or None."""
        worker = self.worker
        block = worker.arena.reserve(max(len(data), 1))
        if block is not None:
            worker.results[block[0]:block[0] + len(data)] = worker.np.frombuffer(data,
                                                                                 worker.np.uint8)
        return block


def _inputs_writable(pw, flags):
    """Whether a CALL's inputs are the function's to write: unless copy=False
    (each block is the call's own copy), and always under torch, which has no
    read-only tensors; otherwise they stand for TF's read-only memory, for
    the function (pulled) and for the copy facts (one_facts) alike."""
    return bool(flags & (pw.CALL_WRITABLE | pw.CALL_TORCH))


class _NoRoom(Exception):
    """A ring call's answer does not fit the result arena, or its DONE the
    reply ring (Channel.fits)."""


def _pickled(value):
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def _exception_payload(exc):
    """(pickled exception or None, builtin base class name, summary, traceback).

    cloudpickle, not pickle: a class that came by value (its module imports
    TensorFlow, so this worker has not imported it) goes back by value, where
    pickle would import its module here to look the class up by name."""
    import traceback  # (only on an error: a worker starts without it)

    import cloudpickle
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    base = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins")
    try:
        data = cloudpickle.dumps(exc, protocol=PICKLE_PROTOCOL)
        pickle.loads(data)  # one that cannot be rebuilt is sent by its base class
    except Exception:  # noqa: BLE001
        data = None
    return data, base, summary, text
