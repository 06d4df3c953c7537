"""The worker process of a ProcessPool (pyfunc_bridge/_process.py), and the
frames on its socket, which both sides use.

Run as a script (``python <this file> PARENT_PID SOCKET_FD INPUT_FD
RESULT_FD``), never as ``-m pyfunc_bridge._worker``: importing the package
would import TensorFlow, which a worker never needs.  At module level it
imports the standard library only; NumPy, cloudpickle (through pickle), the
worker's compiled module (``pool_module``) and the user's function load in
``main``.

Calls come on the request ring of the worker's control segment
(src/pool/shm_layout.h: LOAD, CALL, RESULTS_BACK, FORGET, STOP), served by
_RingServer one at a time and answered on the reply ring (DONE,
INPUTS_BACK).  The socket, one length-prefixed pickle per frame, carries:

* parent -> worker, first: ``{"path": sys.path, "input_bytes": n,
  "result_bytes": n, "name": pool name, "ring": {"control_fd",
  "doorbell_fd", "ring_slots"}}``, and with a pool timeout ``"deadlines":
  {"trace_fd"}``;
* worker -> parent, first: ``("ready", pid)``;
* worker -> parent: ``("need", id)``, asking for a pulled payload (an input
  or a CALL's argument list that did not fit the arena or the ring, a LOAD's
  function), answered by ``("payload", id, pickle or None)``; and
  ``("ring", call_id, ok, pickle, facts)``, an answer too large for the
  result arena, sent before its DONE;
* the end of the stream: the pool closed (seen here) or the worker died
  (seen by the parent).

The result arena is the compiled module's ``ResultArena``: while a function
runs, NumPy allocates its arrays of 64 KiB or more there, so a fresh result
that the arena judges exclusive (nothing else in the worker can reach it) is
sent by its offset without a copy; any other result (one the worker could
still change, a smaller one) is copied into a fresh block.  Either way its
copy facts are computed first, from what the function returned.

Who owns a block: shm_layout.h.  An input block is this worker's from its
CALL (or LOAD) until it posts its offset in INPUTS_BACK: when the last array
(or torch tensor) that views it goes, which is when the call returns unless
the function kept its input (a cache, an accumulator).  A result block is
the parent's from the DONE that carries it until it comes back in
RESULTS_BACK.
"""
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


_JOINED = 1 << 16  # a pickle up to this size is joined to its header (one write)


def frame(obj, dumps):
    """One frame: the length, then the pickle."""
    data = dumps(obj, protocol=_PICKLE_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def send(sock, data):
    """Writes the frame of the pickle `data`.  A large one is written after
    its header rather than joined to it: joining would copy it."""
    if len(data) <= _JOINED:
        sock.sendall(_HEADER.pack(len(data)) + data)
    else:
        sock.sendall(_HEADER.pack(len(data)))
        sock.sendall(data)


class FrameReader:
    """Splits what a socket delivers into frames (several per read when the
    other side wrote several).  Reads into one reused buffer of `size` bytes
    (a fresh buffer per read would cost page faults on every call); a frame
    that does not fit it is read into a buffer of its own, dropped once the
    frame is loaded, so that one large frame leaves no large buffer behind."""

    def __init__(self, sock, size=1 << 20):
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
                        if _HEADER.size + length > len(self._buffer):
                            frames.append(loads(self._read_large(view, begin, length)))
                        break
                    frames.append(loads(view[begin:begin + length]))
                    self._start = begin + length
            if self._start == self._end:
                self._start = self._end = 0
        return frames

    def _read_large(self, view, begin, length):
        """The whole frame at `begin`, of which the buffer holds the start,
        read on into a buffer of its own; the reused buffer is then empty."""
        have = self._end - begin
        data = bytearray(length)
        data[:have] = view[begin:self._end]
        self._start = self._end = 0
        with memoryview(data) as rest:
            while have < length:
                received = self._sock.recv_into(rest[have:])
                if not received:
                    raise ConnectionResetError("the stream ended inside a frame")
                have += received
        return data

    def _make_room(self):
        """Moves the partial frame to the front (a frame that does not fit
        the buffer is read by _read_large)."""
        pending = self._end - self._start
        self._buffer[:pending] = self._buffer[self._start:self._end]
        self._start, self._end = 0, pending


def pool_module():
    """The worker's compiled module (pyfunc_bridge/_pool_worker*.so, built from
    src/pool/ without TensorFlow: the shared-memory layout's rings and arena
    allocator, and the NumPy handler of the result arena), loaded by path:
    importing it through the package would import TensorFlow.  A process that
    loaded it already gets that module."""
    name = "pyfunc_bridge._pool_worker"
    module = sys.modules.get(name)
    if module is not None:
        return module
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_pool_worker" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            return module
    raise ImportError(f"pyfunc_bridge: the worker's compiled module _pool_worker is missing "
                      f"from {here}; build the package (python setup.py build_ext --inplace)")


# ------------------------------------------------------------- copy facts --
# What the parent's copy decision (_copy_reason, src/conversion/copy.pxi)
# would have known of a result in-process: the parent sees only blocks of
# the result arena (a fresh result as it is, anything else copied), yet
# copy=False must refuse what it refuses in-process.  The facts are gathered here as the conversion layer
# gathers them (_array_writable_elsewhere and _export_output for arrays,
# _export_dlpack_output and the framework's adapter for DLPack producers);
# the parent decides.

_CLEAN = (False, True, True, False)  # facts that copy=False refuses nothing for
_adapters = None                     # top-level module name -> framework adapter


def _adapter_named(name):
    """The loaded adapter of framework `name` (pyfunc_bridge/_frameworks.py)."""
    _load_adapters()
    adapter = _adapters[name]
    adapter.load()
    return adapter


def _framework_adapter(value):
    """The adapter (pyfunc_bridge/_frameworks.py) that judges results of
    `value`'s type, or None."""
    _load_adapters()
    top = getattr(type(value), "__module__", None)
    return _adapters.get(top.partition(".")[0]) if isinstance(top, str) else None


def _load_adapters():
    """Loads _frameworks.py by its path: importing it through the package
    would import TensorFlow."""
    global _adapters
    if _adapters is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "_pyfunc_bridge_frameworks", os.path.join(os.path.dirname(__file__), "_frameworks.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _adapters = {name: adapter for adapter in module.ADAPTERS.values()
                     for name in adapter.modules}


def _address(arr):
    return arr.__array_interface__["data"][0]


def _aligned(np, arr):
    """Whether `arr` would be aligned in-process, where NumPy allocates
    every fresh array aligned (the bridge's allocator, alloc.pxi) and this
    worker's NumPy does not: a view of an array that owns its data is
    aligned where its offset into that array is; any other memory where its
    address is."""
    last = arr
    while isinstance(last.base, np.ndarray):
        last = last.base
    start = _address(last) if last.base is None and last.flags.owndata else 0
    return (_address(arr) - start) % ALIGN == 0


def _stored(container, item):
    """How often the list or tuple `container` holds `item`."""
    return sum(1 for x in container if x is item)


def _outside_of(items, container, i, container_outside):
    """References to result item `i` that the worker does not hold, counted
    as _export_outputs counts them (`items`: the tuple iterated)."""
    held = _stored(items, items[i])
    if items is not container:
        held += _stored(container, items[i])
    # getrefcount's argument is the one reference beyond those counted.
    return sys.getrefcount(items[i]) - 1 - held + (1 if container_outside > 0 else 0)


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
            if value.requires_grad:
                # In-process the bridge exports it by DLPack, which refuses
                # it (torch's BufferError, "use tensor.detach()"): so here.
                value.__dlpack__()
            return _torch_numpy(np, value.detach().cpu().resolve_conj().resolve_neg())
    if framework == "jax" and hasattr(value, "__array__") and hasattr(value, "__dlpack__"):
        return np.asarray(value)
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return value


def _torch_numpy(np, t):
    """t.numpy(), for bfloat16 too (which torch has no NumPy type for: its
    bits are viewed as ml_dtypes.bfloat16, TensorFlow's NumPy type)."""
    import torch
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _wrap_input(np, arr, framework):
    if framework == "torch" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import torch
        if arr.dtype.name == "bfloat16":  # (torch.from_numpy knows no ml_dtypes)
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    if framework == "jax" and isinstance(arr, np.ndarray) and arr.dtype.kind != "O":
        import jax.numpy as jnp
        return jnp.asarray(arr)
    return arr


# Results the parent converts itself (_export_output, outputs.pxi): by their
# kind (scalars, lists: to the declared dtype; strings: to tf.string).
_CONVERTED_BY_THE_PARENT = (bool, int, float, complex, list, tuple, str, bytes)


# NumPy allocations of at least this many bytes that a function makes go to
# the result arena: copying a smaller result costs less than a wake-up, and
# small arrays a function keeps (caches, constants made on first use) would
# scatter over the arena and split its free space.
_ARENA_MIN_BYTES = 64 << 10


class _Worker:
    """What the worker holds across calls: its mappings, its functions, the
    input blocks its arrays still view, and the copy facts' rules."""

    def __init__(self, sock, np, input_map, result_map):
        self.sock = sock
        self.np = np
        self.input_map = input_map
        self.inputs_base = _address(np.frombuffer(input_map, np.uint8))
        self.results = np.frombuffer(result_map, np.uint8)
        # The result arena's allocator and NumPy handler (src/pool/): a fresh
        # result of the function is already in shared memory.
        self.arena = pool_module().ResultArena(result_map, _ARENA_MIN_BYTES)
        self.functions = {}  # token -> function
        # id(weak reference) -> (the reference, offset) of each input block
        # something here still views; the reference's callback moves the
        # block's offset to `inputs_freed`, which INPUTS_BACK carries.
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
        self.input_blocks[id(ref)] = (ref, offset)
        return block

    def _input_gone(self, ref):
        _, offset = self.input_blocks.pop(id(ref))
        self.inputs_freed.append(offset)  # INPUTS_BACK names a block by its offset

    def result(self, value, framework):
        """(("s", offset, size, dtype, shape): a block of the result arena, or
        ("v", value): a value the caller encodes otherwise; bytes written to
        the result arena)."""
        np = self.np
        value = _as_numpy(np, value, framework)
        if not isinstance(value, (np.ndarray, np.generic, *_CONVERTED_BY_THE_PARENT,
                                  type(None))):
            # An object exporting an array (a memoryview, an mmap, one with
            # __array__): the parent would take np.asarray of it, and it
            # may not pickle.
            try:
                arr = np.asarray(value)
            except Exception:  # noqa: BLE001 - the parent reports what it is
                arr = None
            if arr is not None and arr.dtype.kind != "O":
                value = arr
        if (isinstance(value, np.ndarray) and value.size
                and _shares_by_memory(np, value.dtype)):
            block = self.arena.take(value)
            if block is not None:  # the function's own arena memory: no copy
                return ("s", *block, value.dtype, value.shape), 0
            block = self.arena.reserve(value.nbytes)
            if block is not None:
                offset, size = block
                out = self.results[offset:offset + value.nbytes].view(value.dtype)
                np.copyto(out.reshape(value.shape), value, casting="no")
                return ("s", offset, size, value.dtype, value.shape), value.nbytes
        return ("v", value), 0

    def copy_facts(self, value, outside, dlpack, read_only, ranges):
        """(writable_elsewhere, compact, aligned, lazy) of a result as the
        function returned it, or None when copy=False refuses nothing (an
        empty array, a fresh compact aligned one, a value converted anew).
        `outside`: references to it the worker does not hold; `dlpack`: an
        array_function call (DLPack producers judged by their adapter);
        `read_only`: the call's input blocks are read-only (as TF's memory
        is in-process); `ranges`: their addresses."""
        np = self.np
        if isinstance(value, np.ndarray):
            if not value.size:
                return None
            facts = (self.writable_elsewhere(value, outside, read_only),
                     value.flags.c_contiguous, _aligned(np, value), False)
        elif dlpack and hasattr(type(value), "__dlpack__") and not isinstance(value, np.generic):
            facts = self.dlpack_facts(value, outside, ranges)
        elif isinstance(value, (np.generic, bool, int, float, complex, list, tuple, str,
                                bytes)) or value is None:
            return None  # converted to a fresh array
        else:  # an object exporting an array: its memory is not ours (aliasing)
            try:
                arr = np.asarray(value)
            except Exception:  # noqa: BLE001 - the parent reports what it is
                return None
            if arr.dtype.kind == "O" or not arr.size:
                return None
            facts = (True, arr.flags.c_contiguous, _aligned(np, arr), False)
        return None if facts is None or facts == _CLEAN else facts

    def one_facts(self, value, outside, writable, framework, ranges):
        """copy_facts of a call's result under its copy policy (`writable`:
        copy=True) and framework."""
        return self.copy_facts(value, outside, framework is not None,
                               not writable and framework != "torch", ranges)

    def items_facts(self, values, result, outside, writable, framework, ranges):
        """one_facts of each of `values`, the items of the function's list or
        tuple `result` (as a tuple), to which the worker holds all but
        `outside` references."""
        facts = []
        for i in range(len(values)):
            item_outside = _outside_of(values, result, i, outside)  # counted first
            facts.append(self.one_facts(values[i], item_outside, writable, framework, ranges))
        return facts

    def writable_elsewhere(self, value, outside, read_only):
        """_array_writable_elsewhere (copy.pxi) in the worker: whether Python
        could write the array's memory after the call.  An input block plays
        the read-only input view's part (or, written under copy=True, that of
        an array that owns its data); its one weak reference is this
        worker's (input_block)."""
        np = self.np
        exclusive = outside == 0 and not weakref.getweakrefcount(value)
        last = value
        base = value.base
        while isinstance(base, np.ndarray):
            ours = self.is_input_block(base)
            # References: its successor's base, `base` here, getrefcount's argument.
            if (sys.getrefcount(base) != 3
                    or weakref.getweakrefcount(base) != (1 if ours else 0)):
                exclusive = False
            last = base
            base = base.base
        if base is not None:
            if not self.is_input_block(last):
                exclusive = False  # memory the function did not allocate
            elif read_only:
                exclusive = True   # nobody can write an input block (TF's memory in-process)
        elif not last.flags.owndata:
            exclusive = False
        return not exclusive

    def is_input_block(self, arr):
        base = arr.base
        return type(base) is memoryview and base.obj is self.input_map

    def dlpack_facts(self, value, outside, ranges):
        """_export_dlpack_output's facts (frameworks.pxi) of a DLPack
        producer: its adapter's resolve (lazy views) and writable_elsewhere,
        a view of an input being TensorFlow's memory, and the layout."""
        adapter = _framework_adapter(value)
        lazy = False
        resolve = getattr(adapter, "resolve", None)
        if resolve is not None:
            resolved = resolve(value)
            if resolved is not None:
                value, lazy = resolved, True
        foreign = not lazy and (adapter.writable_elsewhere(value, outside)
                                if adapter is not None else True)
        try:
            source = value.detach() if hasattr(value, "detach") else value
            if type(value).__module__.startswith("torch") and str(source.dtype) == "torch.bfloat16":
                import torch
                # NumPy's DLPack has no bfloat16; its bits are int16 (not
                # .numpy(), which marks the storage not resizable, as
                # writable_elsewhere would then judge the next result of it).
                source = source.view(torch.int16)
            arr = self.np.from_dlpack(source)
        except Exception:  # noqa: BLE001 - the parent reports what it is
            return None
        if not arr.size:
            return None
        start = _address(arr)
        if foreign and any(lo <= start and start + arr.nbytes <= hi for lo, hi in ranges):
            foreign = False  # a view of an input: TensorFlow's memory in-process
        return (foreign, arr.flags.c_contiguous, start % ALIGN == 0, lazy)


# ------------------------------------------------------------ the rings --
# CALLs name their inputs by PfbPoolTensor records over the pool's input
# arena, and DONEs their results by records over this worker's result arena,
# so a call needs no pickle.  The worker polls its socket and its doorbell
# (an eventfd the parent rings after posting, when the worker has said it
# sleeps) at once.  Dtypes travel as DLPack codes (the pool module's
# dl_dtype and np_dtype: the one table).

def _strings(np, data, shape):
    """An object array of bytes from a strings block: per element a uint64
    little-endian length, then its bytes (shm_layout.h)."""
    count = math.prod(shape)
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        (n,) = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if at + n > len(data):
            raise ValueError("pyfunc_bridge: a strings block ends inside an element")
        out[i] = bytes(data[at:at + n])
        at += n
    return out.reshape(shape)


class _RingServer:
    """A worker's side of its control segment: reads every request there
    is, runs it, and answers on the reply ring, one call at a time, on the
    worker's main thread."""

    def __init__(self, worker, pw, channel, doorbell, sock_fd, reader):
        import select
        self.worker = worker
        self.reader = reader  # the socket's FrameReader, which pull() reads
        self.pw = pw
        self.channel = channel
        self.doorbell = doorbell  # the eventfd the parent rings
        self.sock_fd = sock_fd
        self.poller = select.poll()
        self.poller.register(sock_fd, select.POLLIN)
        self.poller.register(doorbell, select.POLLIN)
        self.load_errors = {}  # token -> the exception its LOAD raised
        self.stopped = False
        # Words per INPUTS_BACK: what fits a message in this ring.
        self.words_per_message = _words_per_message(pw, channel.ring_slots)

    def run(self):
        """Serves the ring until a STOP, or the end of the socket's stream
        (the pool closed, or the parent died), which the socket shows while
        the worker sleeps: the parent sends nothing else unasked."""
        import pickle
        while True:
            while self.serve():
                if self.stopped:
                    return
            if self.wait():
                if not self.reader.read(pickle.loads):
                    return
                raise RuntimeError("pyfunc_bridge: the parent sent a message the worker "
                                   "did not ask for")

    def wait(self):
        """Sleeps until the socket or the doorbell has something; whether
        the socket has (the ring is read anyway, next)."""
        pw = self.pw
        if self.channel.sleeping(pw.REQUESTS, True):
            # Requests came while the flag was up: a parent that saw it may
            # have rung already.  Reset the doorbell so that the next sleep
            # does not wake at once for a ring already served (a ring that
            # comes after this read wakes one sleep early: harmless).
            self.channel.sleeping(pw.REQUESTS, False)
            self._reset_doorbell()
            return False
        try:
            events = self.poller.poll()
        finally:
            self.channel.sleeping(pw.REQUESTS, False)
        self._reset_doorbell()  # rung: reset for the next sleep
        return any(fd == self.sock_fd for fd, _ in events)

    def _reset_doorbell(self):
        try:
            os.eventfd_read(self.doorbell)
        except BlockingIOError:
            pass  # not rung

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
                    self.worker.functions.pop(token, None)
                    self.load_errors.pop(token, None)
            elif kind == pw.MSG_STOP:
                self.stopped = True
        if messages:
            self.inputs_back()
        return bool(messages)

    def inputs_back(self):
        """Posts the ring's input blocks that nothing here views any more."""
        freed = self.worker.inputs_freed
        taken = freed[:]
        del freed[:len(taken)]  # a callback may append meanwhile
        pw = self.pw
        for start in range(0, len(taken), self.words_per_message):
            self.channel.post(pw.REPLIES, pw.MSG_INPUTS_BACK,
                              taken[start:start + self.words_per_message])
        if taken:
            self.channel.notify(pw.REPLIES)

    def load(self, message):
        import importlib
        import pickle
        worker = self.worker
        offset, size = message.block
        data = None
        if not message.flags & self.pw.LOAD_SOCKET:
            try:
                data = bytes(worker.input_map[offset:offset + size])
            finally:
                worker.inputs_freed.append(offset)  # read: the parent's again
        try:
            path, pickled = (pickle.loads(data) if data is not None
                             else self.pull(("load", message.token)))
            if path is not None:
                sys.path[:] = path
            importlib.invalidate_caches()  # modules made since the last import
            worker.functions[message.token] = pickle.loads(pickled)
            self.load_errors.pop(message.token, None)
        except BaseException as exc:  # noqa: BLE001 - each CALL of it raises it
            self.load_errors[message.token] = exc

    def pull(self, payload_id):
        """What the parent keeps under `payload_id` (shm_layout.h,
        PFB_POOL_TENSOR_SOCKET: an input, or a packed CALL's inputs; a
        LOAD's function, by ("load", token)), asked for on the socket."""
        import pickle
        send(self.worker.sock, pickle.dumps(("need", payload_id), protocol=_PICKLE_PROTOCOL))
        while True:
            frames = self.reader.read(pickle.loads)
            if not frames:
                raise ConnectionResetError("pyfunc_bridge: the pool closed while the worker "
                                           "waited for a call's input")
            for frame in frames:  # (one: pulls come one at a time)
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
            return [self.pulled(value, flags) for value in self.pull(record[4])]
        return [self.arg(t, flags) for t in message.items]

    def pulled(self, value, flags):
        """An input pulled over the socket, as a block's input would be:
        writable only under copy=True and torch; 0-d a NumPy scalar under
        PFB_POOL_CALL_SCALARS.  A value the records cannot describe stays
        as it came."""
        pw, np = self.pw, self.worker.np
        if not isinstance(value, np.ndarray):
            return value
        if flags & (pw.CALL_WRITABLE | pw.CALL_TORCH):
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
            return self.pulled(self.pull(offset), flags)
        if tflags & pw.TENSOR_STRINGS:
            block = worker.input_block(offset, size) if size else b""
            arr = _strings(np, memoryview(block), shape)
            del block  # decoded: the block goes back
        else:
            dtype = pw.np_dtype(code, bits)
            count = math.prod(shape)
            if not count or not size:
                arr = np.zeros(shape, dtype)
            else:
                if count * dtype.itemsize > size:
                    raise ValueError(f"pyfunc_bridge: an input of shape {shape} does not "
                                     f"fit its {size}-byte block")
                arr = worker.input_block(offset, size).view(dtype)[:count].reshape(shape)
            # Written only under copy=True, as the bridge's inputs are, and
            # by torch (which has no read-only tensors).
            if not flags & (pw.CALL_WRITABLE | pw.CALL_TORCH):
                arr.flags.writeable = False
        if flags & pw.CALL_SCALARS and arr.ndim == 0:
            return arr[()]
        return arr

    def call(self, message):
        pw, worker = self.pw, self.worker
        np = worker.np
        started = time.time_ns()
        self.channel.set_running(message.call_id, time.monotonic_ns())
        flags = message.flags
        framework = pw.FLAG_FRAMEWORKS.get(flags & pw.CALL_FRAMEWORKS)
        writable = bool(flags & pw.CALL_WRITABLE)
        tensors = []
        shape_kind = pw.DONE_ONE
        status, block = pw.STATUS_OK, (0, 0)
        result = None
        try:
            func = worker.functions.get(message.token)
            if func is None:
                error = self.load_errors.get(message.token)
                if error is not None:
                    raise error
                raise RuntimeError(f"pyfunc_bridge: worker {os.getpid()} has no function "
                                   f"of token {message.token} (no LOAD came before the CALL)")
            values = [_wrap_input(np, v, framework) for v in self.args(message, flags)]
            result = worker.arena.call(func, values)
            if framework == "torch" and not writable:
                # In-process the tensors are TensorFlow's memory, and a write
                # to one fails the call (the adapter sees it): here too,
                # though the blocks are this call's own.
                _adapter_named("torch").check_inputs(values)
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
                ranges = self.input_ranges(message.items) if framework is not None else ()
                facts = (worker.items_facts(items, result, outside, writable, framework, ranges)
                         if shape_kind != pw.DONE_ONE
                         else [worker.one_facts(result, outside, writable, framework, ranges)])
            try:
                for index, (value, value_facts) in enumerate(zip(items, facts)):
                    tensors.append(self.encode(value, framework, value_facts, index))
            except _NoRoom:  # the whole answer goes by the socket, as NumPy values
                self.give_back_tensors(tensors)
                tensors = []
                converted = [_as_numpy(np, value, framework) for value in items]
                answer = (converted[0] if shape_kind == pw.DONE_ONE
                          else converted if shape_kind == pw.DONE_LIST else tuple(converted))
                status = self.by_socket(message.call_id, True, _pickled(answer), facts)
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            self.give_back_tensors(tensors)
            tensors = []
            status = pw.STATUS_ERROR
            payload = _pickled(_exception_payload(exc))
            block = self.place(payload)
            if block is None:
                status, block = self.by_socket(message.call_id, False, payload, None), (0, 0)
        finally:
            self.channel.set_running(0)
            result = items = converted = answer = None
        # The inputs it let go of go back before its DONE: a caller that sees
        # the call done and no room can then tell kept blocks from late ones.
        self.inputs_back()
        self.channel.post_tensors(pw.REPLIES, pw.MSG_DONE, tensors, call_id=message.call_id,
                                  flags=shape_kind, status=status, block=block,
                                  stamp=started, ended=time.time_ns())

    def input_ranges(self, records):
        """The addresses of a CALL's input blocks (a DLPack producer's facts
        take a view of one for TensorFlow's memory, as in-process)."""
        base = self.worker.inputs_base
        return [(base + r[4], base + r[4] + math.prod(r[6]) * (r[1] // 8) * r[2])
                for r in records if r[5] and not r[3] & self.pw.TENSOR_STRINGS]

    def give_back_tensors(self, tensors):
        """Frees the result blocks of records that will not be sent."""
        for tensor in tensors:
            if tensor[5]:
                self.worker.arena.hand_back(tensor[4])

    def by_socket(self, call_id, ok, data, facts):
        """An answer the result arena has no room for goes pickled on the
        socket, before its DONE (shm_layout.h, PFB_POOL_STATUS_SOCKET), with
        its results' copy facts."""
        import pickle
        send(self.worker.sock, pickle.dumps(("ring", call_id, ok, data, facts),
                                            protocol=_PICKLE_PROTOCOL))
        return self.pw.STATUS_SOCKET

    def encode(self, value, framework, facts, index=0):
        """A result's tensor record, its copy facts in its flags: its block
        in the result arena (the function's own memory when the arena can
        share it, else a copy), or its pickle in a block
        (PFB_POOL_TENSOR_PICKLED).  A framework's array goes as NumPy's."""
        pw, worker = self.pw, self.worker
        np = worker.np
        fact_bits = pw.facts_flags(facts)
        item, moved = worker.result(value, framework)
        if item[0] == "s":
            _, offset, size, dtype, shape = item
            dl = pw.dl_dtype(dtype)
            if dl is not None:
                return (*dl, (0 if moved else pw.TENSOR_SHARED) | fact_bits, offset, size,
                        tuple(shape))
            worker.arena.hand_back(offset)  # a dtype the records cannot name
            value = worker.results[offset:offset + size].view(dtype)[:math.prod(shape)] \
                .reshape(shape).copy()
        else:
            value = item[1]
            # A NumPy scalar (numpy_function's usual 0-d result) is memory
            # too: its bytes in a block, so that the parent's kernel takes it
            # without Python.  (A Python number stays a value: the parent's
            # checks convert it, as in-process.)
            dl = pw.dl_dtype(value.dtype) if isinstance(value, np.generic) else None
            if dl is not None:
                data = value.tobytes()
                block = self.place(data)
                if block is not None:
                    return (*dl, fact_bits, block[0], len(data), ())
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


class _NoRoom(Exception):
    """A ring call's result does not fit the result arena."""


def _pickled(value):
    import pickle
    return pickle.dumps(value, protocol=_PICKLE_PROTOCOL)


def _words_per_message(pw, ring_slots):
    return 8 * (min(ring_slots, 64) - 1)


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


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid, signal):
    """Has the kernel kill this process when its parent dies, whatever the
    function it is running does (a function that sleeps or loops never reads
    the end of its socket).  The parent may have died before this ran: then
    this process has another parent already, and ends now."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as exc:  # not Linux: the socket's end still ends it
        print(f"pyfunc_bridge worker: cannot ask to die with the parent ({exc}); a "
              f"worker busy in a function outlives a killed parent", file=sys.stderr)
    if os.getppid() != parent_pid:
        os._exit(0)


def _watched(deadlines, signal):
    """A pool with a timeout: on SIGUSR1 (the parent's watchdog, which read
    the call's start in the control segment) this worker writes its Python
    stack to its trace file, then lets the signal end it (chain=True calls
    SIGUSR1's default action, which ends the process)."""
    import faulthandler
    faulthandler.register(signal.SIGUSR1, file=deadlines["trace_fd"], all_threads=True,
                          chain=True)


def main(argv):
    import mmap
    import signal
    _die_with_parent(int(argv[1]), signal)
    # Ctrl-C reaches the whole process group: the parent decides when
    # workers end (it closes the socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock_fd, input_fd, result_fd = (int(a) for a in argv[2:5])
    sock = socket.socket(fileno=sock_fd)
    import pickle
    reader = FrameReader(sock)
    frames = reader.read(pickle.loads)  # the hello
    if not frames:
        return 0
    (hello,) = frames
    # The parent's imports must resolve here as there (its sys.path; the
    # working directory is inherited).
    sys.path[:] = hello["path"]
    _batch_policy()
    import numpy as np
    maps = []
    for fd, size in ((input_fd, hello["input_bytes"]), (result_fd, hello["result_bytes"])):
        maps.append(mmap.mmap(fd, size))
        os.close(fd)
    worker = _Worker(sock, np, maps[0], maps[1])
    deadlines = hello.get("deadlines")
    if deadlines is not None:
        _watched(deadlines, signal)
    rings = hello["ring"]
    pw = pool_module()
    control = mmap.mmap(rings["control_fd"], pw.control_bytes(rings["ring_slots"]))
    os.close(rings["control_fd"])
    ring = _RingServer(worker, pw, pw.Channel(control), rings["doorbell_fd"], sock_fd, reader)
    ring.channel.announce(os.getpid())
    try:
        sock.sendall(frame(("ready", os.getpid()), pickle.dumps))
        ring.run()
    except ConnectionError:
        pass  # the pool closed (maybe before this worker was ready), or the parent is gone
    except EOFError:  # the pool module's ChannelClosed: the parent closed the rings
        pass
    return 0


if __name__ == "__main__":
    # Not the package directory (this script's): the parent's path replaces it.
    del sys.path[0]
    sys.exit(main(sys.argv))
