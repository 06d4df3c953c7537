# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""A ProcessPool worker's compiled module: the pool's shared memory
(src/pool/shm_layout.h) as Python sees it, and the NumPy data-memory handler
that puts a function's fresh arrays in the worker's result arena.

It holds the C the worker shares with the kernel (src/pool/: the arena
allocator, the rings, the message records) and needs neither TensorFlow nor
the op library: setup.py builds it from src/pool/ with NumPy's headers only,
and a worker loads it by path (``pool_module`` in pyfunc_bridge/_worker.py),
never through the package, whose import would bring TensorFlow in.

* ``Arena``: the block allocator of an arena (offsets only).
* ``Channel``: a worker's control segment, its request and reply rings.
* ``ResultArena``: a worker's result arena and its NumPy handler: while
  ``call`` runs a function, NumPy allocates the function's arrays in the
  arena, so that a fresh result is already in shared memory; ``take`` hands
  such a result to the parent without a copy when nothing else in the worker
  can still reach it.
"""
from libc.errno cimport (E2BIG, EAGAIN, EINVAL, EMSGSIZE, ENOMEM, ENOSPC, EPIPE, EPROTO,
                         ETIMEDOUT)
from libc.stdint cimport SIZE_MAX, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset, strncpy
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE

cimport numpy as cnp

from includes.arena cimport *
from includes.dispatch cimport *
from includes.numpy_handler cimport PyDataMem_Handler, PyDataMem_SetHandler
from includes.pthread cimport *
from includes.records cimport *
from includes.ring cimport *
from includes.shm_layout cimport *

import collections
import os

cnp.import_array()

cdef extern from *:
    """
    /* The control segment's words that the other process reads: atomic. */
    static inline uint64_t pfb_load64(uint64_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline uint32_t pfb_load32(uint32_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void pfb_store64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline void pfb_store32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    """
    uint64_t pfb_load64(uint64_t* p) nogil
    uint32_t pfb_load32(uint32_t* p) nogil
    void pfb_store64(uint64_t* p, uint64_t v) nogil
    void pfb_store32(uint32_t* p, uint32_t v) nogil

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject* obj)
    PyTypeObject* Py_TYPE(PyObject* obj)
    # The one field of the type object read here.
    ctypedef struct PyTypeWeaklist "PyTypeObject":
        Py_ssize_t tp_weaklistoffset

cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyArrayObject
    PyTypeObject PyArray_Type
    bint PyArray_Check(PyObject* obj)
    PyObject* PyArray_BASE(PyArrayObject* arr)
    void* PyArray_DATA(PyArrayObject* arr)
    int PyArray_FLAGS(PyArrayObject* arr)
    bint PyArray_IS_C_CONTIGUOUS(PyArrayObject* arr)
    cnp.npy_intp PyArray_NBYTES(PyArrayObject* arr)
    int NPY_ARRAY_OWNDATA

ALIGN = PFB_POOL_ALIGN
SLOT_BYTES = PFB_POOL_SLOT_BYTES
MAX_NDIM = PFB_POOL_MAX_NDIM
DEFAULT_CHECKS = PFB_RING_CHECKS
REQUESTS = 0
REPLIES = 1
MSG_LOAD = PFB_POOL_MSG_LOAD
MSG_CALL = PFB_POOL_MSG_CALL
MSG_RESULTS_BACK = PFB_POOL_MSG_RESULTS_BACK
MSG_FORGET = PFB_POOL_MSG_FORGET
MSG_STOP = PFB_POOL_MSG_STOP
MSG_DONE = PFB_POOL_MSG_DONE
MSG_INPUTS_BACK = PFB_POOL_MSG_INPUTS_BACK
MSG_WORDS = PFB_POOL_MSG_WORDS
TENSOR_STRINGS = PFB_POOL_TENSOR_STRINGS
TENSOR_PICKLED = PFB_POOL_TENSOR_PICKLED
TENSOR_SHARED = PFB_POOL_TENSOR_SHARED
TENSOR_ALIASED = PFB_POOL_TENSOR_ALIASED
TENSOR_STRIDED = PFB_POOL_TENSOR_STRIDED
TENSOR_UNALIGNED = PFB_POOL_TENSOR_UNALIGNED
TENSOR_LAZY = PFB_POOL_TENSOR_LAZY
TENSOR_REFUSED_MASK = PFB_POOL_TENSOR_REFUSED_MASK
CALL_WRITABLE = PFB_POOL_CALL_WRITABLE
CALL_SCALARS = PFB_POOL_CALL_SCALARS
CALL_TORCH = PFB_POOL_CALL_TORCH
CALL_JAX = PFB_POOL_CALL_JAX
CALL_FACTS = PFB_POOL_CALL_FACTS
CALL_CUPY = PFB_POOL_CALL_CUPY
CALL_FRAMEWORKS = PFB_POOL_CALL_FRAMEWORKS
CALL_PACKED = PFB_POOL_CALL_PACKED
TENSOR_SOCKET = PFB_POOL_TENSOR_SOCKET
LOAD_SOCKET = PFB_POOL_LOAD_SOCKET
# The CALL flag of each framework (shm_layout.h); None: NumPy.
FRAMEWORK_FLAGS = {None: 0, "torch": PFB_POOL_CALL_TORCH, "jax": PFB_POOL_CALL_JAX,
                   "cupy": PFB_POOL_CALL_CUPY}
FLAG_FRAMEWORKS = {flag: name for name, flag in FRAMEWORK_FLAGS.items() if flag}


def facts_flags(facts):
    """A result's copy facts, (writable_elsewhere, compact, aligned, lazy) or
    None (_worker.py, _Worker.copy_facts), as PfbPoolTensor flag bits."""
    if facts is None:
        return 0
    aliased, compact, aligned, lazy = facts
    return ((PFB_POOL_TENSOR_ALIASED if aliased else 0)
            | (0 if compact else PFB_POOL_TENSOR_STRIDED)
            | (0 if aligned else PFB_POOL_TENSOR_UNALIGNED)
            | (PFB_POOL_TENSOR_LAZY if lazy else 0))


def flags_facts(uint32_t flags):
    """facts_flags' inverse: None where no bit is set (copy=False refuses
    nothing)."""
    if not flags & PFB_POOL_TENSOR_REFUSED_MASK:
        return None
    return (bool(flags & PFB_POOL_TENSOR_ALIASED), not flags & PFB_POOL_TENSOR_STRIDED,
            not flags & PFB_POOL_TENSOR_UNALIGNED, bool(flags & PFB_POOL_TENSOR_LAZY))


DONE_ONE = PFB_POOL_DONE_ONE
DONE_TUPLE = PFB_POOL_DONE_TUPLE
DONE_LIST = PFB_POOL_DONE_LIST
STATUS_OK = PFB_POOL_STATUS_OK
STATUS_ERROR = PFB_POOL_STATUS_ERROR
STATUS_SOCKET = PFB_POOL_STATUS_SOCKET
HANDLER_NAME = "pyfunc_bridge_result_arena"

# A message read from a ring: `items` are its words (offsets, tokens), or for
# a CALL or DONE its tensors, each (code, bits, lanes, flags, offset, size,
# shape).
Message = collections.namedtuple(
    "Message", "kind call_id token flags status stamp block items ended")

cdef set _TENSOR_KINDS = {PFB_POOL_MSG_CALL, PFB_POOL_MSG_DONE}
# Waits are cut into slices this long so that a signal (Ctrl-C) is handled.
cdef int64_t _SLICE_NS = 50_000_000


def control_bytes(uint32_t ring_slots):
    """The bytes of a worker's control segment with `ring_slots` slots per ring."""
    return pfb_pool_control_bytes(ring_slots)


cdef int64_t _timeout_ns(object timeout) except? -2:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
    return <int64_t>(timeout * 1e9)


# ------------------------------------------------------------------ Arena --

cdef class Arena:
    """The block allocator of one arena (src/pool/arena.h): offsets in
    ``[0, size)``, blocks aligned to and a multiple of ALIGN bytes, freed
    neighbours merged.  A block that is not live cannot be freed.

    >>> arena = Arena(1 << 12)
    >>> arena.alloc(100)
    (0, 128)
    >>> arena.free(0); arena.free_bytes()
    4096
    """
    cdef PfbArena* _arena

    def __cinit__(self, uint64_t size):
        self._arena = pfb_arena_new(size)
        if self._arena == NULL:
            raise MemoryError("pyfunc_bridge: no memory for an arena's bookkeeping")

    def __dealloc__(self):
        pfb_arena_delete(self._arena)

    @property
    def size(self):
        return pfb_arena_bytes(self._arena)

    def alloc(self, uint64_t nbytes):
        """(offset, size) of a fresh block of at least `nbytes`, or None."""
        cdef uint64_t offset, size
        if pfb_arena_alloc(self._arena, nbytes, &offset, &size) != 0:
            return None
        return offset, size

    def free(self, uint64_t offset):
        """Frees the block at `offset`; ValueError if no live block starts there."""
        if pfb_arena_free(self._arena, offset) != 0:
            raise ValueError(f"pyfunc_bridge: no live arena block starts at offset {offset}")

    def free_bytes(self):
        return pfb_arena_free_bytes(self._arena)

    def largest_free(self):
        return pfb_arena_largest_free(self._arena)

    def live_blocks(self):
        return pfb_arena_live_blocks(self._arena)

    def free_ranges(self):
        return pfb_arena_free_ranges(self._arena)


# ---------------------------------------------------------------- Channel --

class ChannelClosed(EOFError):
    """The other side closed the ring (and it is drained)."""


cdef class Channel:
    """A worker's control segment (shm_layout.h: PfbPoolControl and its two
    rings) in a writable buffer this process mapped (an mmap of the memfd).

    ``Channel(buffer, create=True, ring_slots=n)`` lays it out (the parent,
    before the worker starts); ``Channel(buffer)`` checks and attaches to one.
    Each ring has one producer and one consumer; posting and reading hold the
    GIL, only waits release it.  A message is built in one buffer and read
    into another: a post waiting for room (the GIL released) while another
    thread of this process reads the other ring must not find its message
    overwritten by the one read.
    """
    cdef Py_buffer _view
    cdef bint _has_view
    cdef PfbPoolControl* _control
    cdef PfbRing _rings[2]
    cdef uint32_t _slots
    cdef PfbPoolSlot* _scratch  # the message being built (post, post_tensors)
    cdef PfbPoolSlot* _inbox    # the message being read (receive)

    def __cinit__(self, buffer, *, bint create=False, uint32_t ring_slots=0,
                  uint64_t input_bytes=0, uint64_t result_bytes=0, uint32_t worker_index=0,
                  int doorbell=-1):
        PyObject_GetBuffer(buffer, &self._view, PyBUF_WRITABLE)
        self._has_view = True
        if <uintptr_t>self._view.buf % PFB_POOL_SLOT_BYTES:
            raise ValueError("pyfunc_bridge: a control segment must start on a cache line")
        self._control = <PfbPoolControl*>self._view.buf
        if create:
            if ring_slots < 2 or ring_slots & (ring_slots - 1) or ring_slots > (1 << 20):
                raise ValueError(f"ring_slots must be a power of two in [2, 2**20], "
                                 f"got {ring_slots}")
            if <uint64_t>self._view.len < pfb_pool_control_bytes(ring_slots):
                raise ValueError(f"pyfunc_bridge: {self._view.len} bytes cannot hold a "
                                 f"control segment of {ring_slots} slots per ring")
            memset(self._control, 0, sizeof(PfbPoolControl))
            self._control.version = PFB_POOL_LAYOUT_VERSION
            self._control.ring_slots = ring_slots
            self._control.input_arena_bytes = input_bytes
            self._control.result_arena_bytes = result_bytes
            self._control.parent_pid = os.getpid()
            self._control.worker_index = worker_index
        else:
            ring_slots = self._control.ring_slots
            if (self._control.magic != PFB_POOL_MAGIC
                    or self._control.version != PFB_POOL_LAYOUT_VERSION):
                raise ValueError("pyfunc_bridge: not a pool control segment of this "
                                 "version (magic or layout version differs)")
            if (ring_slots < 2 or ring_slots & (ring_slots - 1)
                    or <uint64_t>self._view.len < pfb_pool_control_bytes(ring_slots)):
                raise ValueError(f"pyfunc_bridge: a control segment of {self._view.len} "
                                 f"bytes claims {ring_slots} slots per ring")
        self._slots = ring_slots
        pfb_ring_attach(&self._rings[0], &self._control.requests,
                        pfb_pool_request_slots(self._control), ring_slots)
        pfb_ring_attach(&self._rings[1], &self._control.replies,
                        pfb_pool_request_slots(self._control) + ring_slots, ring_slots)
        # The request ring's producer (the parent) rings the worker's
        # eventfd, on which the worker polls with its socket.
        pfb_ring_set_doorbell(&self._rings[0], doorbell)
        if create:
            pfb_ring_reset(&self._rings[0])
            pfb_ring_reset(&self._rings[1])
            # Last: a control segment with the magic is complete.
            self._control.magic = PFB_POOL_MAGIC
        self._scratch = <PfbPoolSlot*>calloc(PFB_POOL_MAX_MESSAGE_SLOTS, sizeof(PfbPoolSlot))
        self._inbox = <PfbPoolSlot*>calloc(PFB_POOL_MAX_MESSAGE_SLOTS, sizeof(PfbPoolSlot))
        if self._scratch == NULL or self._inbox == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self._scratch)
        free(self._inbox)
        if self._has_view:
            PyBuffer_Release(&self._view)

    cdef PfbRing* _ring(self, int ring) except NULL:
        if ring != REQUESTS and ring != REPLIES:
            raise ValueError(f"ring must be REQUESTS (0) or REPLIES (1), got {ring}")
        return &self._rings[ring]

    @property
    def ring_slots(self):
        return self._slots

    @property
    def parent_pid(self):
        return self._control.parent_pid

    @property
    def worker_pid(self):
        return pfb_load32(&self._control.worker_pid)

    @property
    def worker_ready(self):
        """Whether the worker serves its request ring."""
        return bool(pfb_load32(&self._control.worker_ready))

    def announce(self, uint32_t pid):
        """The worker's side: it serves its request ring from now on."""
        pfb_store32(&self._control.worker_pid, pid)
        pfb_store32(&self._control.worker_ready, 1)

    def set_running(self, uint64_t call_id, uint64_t since_ns=0):
        """The worker's side: the call it runs now (0: none), and since when
        (CLOCK_MONOTONIC ns): the time first, so that a reader that sees the
        call sees its time.  A call counts as started here, before it runs."""
        if call_id:
            pfb_store64(&self._control.ring_calls_started,
                        pfb_load64(&self._control.ring_calls_started) + 1)
        pfb_store64(&self._control.running_since, since_ns)
        pfb_store64(&self._control.running_call, call_id)

    @property
    def running_call(self):
        return pfb_load64(&self._control.running_call)

    def running(self):
        """(the call the worker runs, 0: none; since when, CLOCK_MONOTONIC
        ns), read whole: the pool's watchdog reads its deadlines here."""
        cdef uint64_t call_id, since
        while True:
            call_id = pfb_load64(&self._control.running_call)
            since = pfb_load64(&self._control.running_since)
            # Ids are never reused: the same id twice brackets its own time.
            if pfb_load64(&self._control.running_call) == call_id:
                return call_id, since

    def sleeping(self, int ring, bint flag):
        """A consumer that sleeps elsewhere (poll on the doorbell and a
        socket) announces it (True) or that it is awake (False).  With True:
        whether a message came meanwhile, which the caller reads instead of
        sleeping (the producer may have looked at the flag before it was set)."""
        cdef PfbRing* r = self._ring(ring)
        pfb_ring_set_consumer_sleeping(r, flag)
        return flag and pfb_ring_available(r) != 0

    def room(self, int ring):
        """Slots free for the producer of `ring` now."""
        return pfb_ring_room(self._ring(ring))

    def available(self, int ring):
        """Slots published on `ring` and not read yet."""
        cdef uint32_t n = pfb_ring_available(self._ring(ring))
        return min(n, self._slots)

    def wakes(self, int ring):
        """FUTEX_WAKE calls this process made for `ring` (as its producer,
        and as its consumer waking a producer that waited for room)."""
        return self._ring(ring).wakes

    def sleeps(self, int ring):
        """FUTEX_WAIT calls this process made on `ring`."""
        return self._ring(ring).sleeps

    def consumer_sleeping(self, int ring):
        """Whether the consumer of `ring` (maybe in the other process) has
        announced that it sleeps (its flag: a producer's notify wakes it)."""
        return bool(pfb_ring_consumer_sleeping(self._ring(ring)))

    @property
    def closed(self):
        return bool(pfb_ring_closed(&self._rings[0]) or pfb_ring_closed(&self._rings[1]))

    def close(self):
        """Ends both rings: every wait, here and in the other process, returns."""
        pfb_ring_close(&self._rings[0])
        pfb_ring_close(&self._rings[1])

    cdef int _wait_room(self, PfbRing* ring, uint32_t slots, int64_t timeout_ns) except -1:
        """0 when there is room; 1 after the timeout."""
        cdef int rc
        cdef int64_t part
        while True:
            part = _SLICE_NS if timeout_ns < 0 or timeout_ns > _SLICE_NS else timeout_ns
            with nogil:
                rc = pfb_ring_wait_room(ring, slots, part)
            if rc == 0:
                return 0
            if rc == EPIPE:
                raise ChannelClosed("pyfunc_bridge: the ring is closed")
            if rc == EMSGSIZE:
                raise ValueError(f"pyfunc_bridge: a message of {slots} slots cannot fit "
                                 f"a ring of {ring.capacity}")
            PyErr_CheckSignals()
            if timeout_ns >= 0:
                timeout_ns -= part
                if timeout_ns <= 0:
                    return 1

    cdef bint _write(self, int ring, object timeout) except -1:
        cdef PfbRing* r = self._ring(ring)
        if self._wait_room(r, self._scratch[0].message.slots, _timeout_ns(timeout)):
            return False
        cdef int rc = pfb_ring_write(r, self._scratch)
        if rc == EPIPE:
            raise ChannelClosed("pyfunc_bridge: the ring is closed")
        if rc != 0:  # EAGAIN cannot happen: this side is the only producer
            raise OSError(rc, f"pyfunc_bridge: writing a message failed ({rc})")
        return True

    cdef void _header(self, int kind, uint64_t call_id, uint64_t token, uint32_t flags,
                      uint32_t status, uint64_t stamp, object block,
                      uint64_t ended=0) except *:
        pfb_msg_init(self._scratch, <unsigned short>kind)
        cdef PfbPoolMessage* m = &self._scratch[0].message
        m.call_id = call_id
        m.token = token
        m.flags = flags
        m.status = status
        m.stamp = stamp
        m.ended = ended
        m.block_offset = block[0]
        m.block_size = block[1]

    def post(self, int ring, int kind, words=(), *, uint64_t call_id=0, uint64_t token=0,
             uint32_t flags=0, uint32_t status=0, uint64_t stamp=0, block=(0, 0),
             timeout=None):
        """Publishes one message of `words` (offsets, tokens) on `ring`,
        waiting up to `timeout` seconds (None: no limit) for room; does not
        wake the consumer (``notify`` once per batch).  True once posted,
        False after the timeout."""
        self._header(kind, call_id, token, flags, status, stamp, block)
        for word in words:
            if pfb_msg_add_word(self._scratch, PFB_POOL_MAX_MESSAGE_SLOTS, word):
                raise ValueError(f"pyfunc_bridge: {len(words)} words do not fit one message")
        return self._write(ring, timeout)

    def post_tensors(self, int ring, int kind, tensors, *, uint64_t call_id=0,
                     uint64_t token=0, uint32_t flags=0, uint32_t status=0,
                     uint64_t stamp=0, block=(0, 0), timeout=None, uint64_t ended=0):
        """Publishes a CALL or DONE: `tensors`, each (code, bits, lanes,
        flags, offset, size, shape); as ``post`` otherwise."""
        cdef PfbPoolTensor record
        cdef int64_t dims[PFB_POOL_MAX_NDIM]
        cdef int rc
        self._header(kind, call_id, token, flags, status, stamp, block, ended)
        for code, bits, lanes, tflags, offset, size, shape in tensors:
            memset(&record, 0, sizeof(record))
            record.code = code
            record.bits = bits
            record.lanes = lanes
            record.flags = tflags
            record.offset = offset
            record.size = size
            if len(shape) > PFB_POOL_MAX_NDIM:
                raise ValueError(f"pyfunc_bridge: a tensor of {len(shape)} dimensions; "
                                 f"at most {PFB_POOL_MAX_NDIM} are supported")
            record.ndim = len(shape)
            for d, n in enumerate(shape):
                if n < 0:
                    raise ValueError(f"pyfunc_bridge: a negative dimension in {shape}")
                dims[d] = n
            rc = pfb_msg_add_tensor(self._scratch, PFB_POOL_MAX_MESSAGE_SLOTS, &record, dims)
            if rc:
                raise ValueError(f"pyfunc_bridge: {len(tensors)} tensors do not fit one "
                                 f"message")
        return self._write(ring, timeout)

    def notify(self, int ring):
        """Wakes the consumer of `ring` if it sleeps (once for everything
        posted since): whether a FUTEX_WAKE was made."""
        return bool(pfb_ring_notify(self._ring(ring)))

    def wait(self, int ring, timeout=None, uint32_t checks=PFB_RING_CHECKS,
             bint interruptible=True):
        """Sleeps until `ring` has a message (after `checks` quick checks):
        True; False after `timeout` seconds; ChannelClosed once the other
        side closed it and it is drained.  `interruptible`: wakes every 50 ms
        to handle signals (Ctrl-C); False sleeps in one piece, so that the
        sleeper flag stays set for the whole wait."""
        cdef PfbRing* r = self._ring(ring)
        cdef int64_t left = _timeout_ns(timeout)
        cdef int64_t part
        cdef int rc
        while True:
            part = _SLICE_NS if interruptible and (left < 0 or left > _SLICE_NS) else left
            with nogil:
                rc = pfb_ring_wait_items(r, part, checks)
            if rc == 0:
                return True
            if rc == EPIPE:
                raise ChannelClosed("pyfunc_bridge: the ring was closed")
            PyErr_CheckSignals()
            if left >= 0:
                left -= part
                if left <= 0:
                    return False
            checks = 0

    def receive(self, int ring, limit=None):
        """Every message on `ring` now (at most `limit`), read and taken off
        the ring, without waiting: a list of Message."""
        cdef PfbRing* r = self._ring(ring)
        cdef list messages = []
        cdef int n
        while limit is None or len(messages) < limit:
            n = pfb_ring_read(r, self._inbox, PFB_POOL_MAX_MESSAGE_SLOTS)
            if n == 0:
                break
            if n < 0:
                raise OSError(-n, f"pyfunc_bridge: a malformed message on the ring "
                                  f"({'EPROTO' if n == -EPROTO else n})")
            messages.append(self._decode())
        return messages

    cdef object _decode(self):
        return _decode_message(self._inbox)


cdef object _decode_message(const PfbPoolSlot* slots):
    """A Message of a read message's slots (validated: EPROTO, never a read
    past its end)."""
    cdef const PfbPoolMessage* m = &slots[0].message
    cdef PfbPoolTensor record
    cdef int64_t dims[PFB_POOL_MAX_NDIM]
    cdef uint32_t cursor = 1
    cdef uint32_t i
    cdef uint64_t word
    items = []
    if m.kind in _TENSOR_KINDS:
        for i in range(m.count):
            if pfb_msg_read_tensor(slots, &cursor, &record, dims):
                raise OSError(EPROTO, "pyfunc_bridge: a malformed tensor record")
            items.append((record.code, record.bits, record.lanes, record.flags,
                          record.offset, record.size,
                          tuple([dims[d] for d in range(record.ndim)])))
    else:
        for i in range(m.count):
            if pfb_msg_read_word(slots, i, &word):
                raise OSError(EPROTO, "pyfunc_bridge: a malformed words message")
            items.append(word)
    return Message(m.kind, m.call_id, m.token, m.flags, m.status, m.stamp,
                   (m.block_offset, m.block_size), items, m.ended)


# ------------------------------------------------------------- Dispatcher --

cdef class _Held:
    """A writable buffer's view, kept (the mapping cannot close meanwhile)."""
    cdef Py_buffer view
    cdef bint has_view

    def __cinit__(self, buffer):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE)
        self.has_view = True

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)


class DispatchFailed(RuntimeError):
    """A dispatched call failed without a reply: (TF error code, message)."""


cdef class NativeArena:
    """A reference on a worker's result arena as the dispatcher maps it
    (PfbDispatchArena): while this object lives, the mapping does.  Result
    blocks go back to their worker by ``back(offset)`` (the conversion
    layer's result views, worker_result, call it when they go)."""
    cdef PfbDispatchArena* _a

    def __dealloc__(self):
        pfb_dispatch_arena_drop(self._a)

    @property
    def index(self):
        return self._a.index

    @property
    def generation(self):
        return self._a.generation

    def back(self, uint64_t offset):
        pfb_dispatch_arena_back(self._a, offset)

    def array(self):
        """A read-only uint8 array over the whole mapping; it keeps this
        object, and so the mapping."""
        cdef cnp.npy_intp length = <cnp.npy_intp>self._a.bytes
        arr = cnp.PyArray_SimpleNewFromData(1, &length, cnp.NPY_UINT8, self._a.base)
        cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
        cnp.set_array_base(arr, self)
        return arr


cdef NativeArena _native_arena(PfbDispatchArena* a):
    """A NativeArena holding a reference of its own on `a`."""
    cdef NativeArena made = NativeArena.__new__(NativeArena)
    pfb_dispatch_arena_keep(a)
    made._a = a
    return made


# ----------------------------------------------------------------- dtypes --
# DLPack's DLDataTypeCode (PfbPoolTensor.code) of each NumPy dtype kind whose
# values travel as memory, bfloat16's apart: the one table, for the records
# Python posts (route.pxi), those the worker reads and writes (_worker.py)
# and the replies the parent decodes (_process.py, _answer).
cdef dict _DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
cdef dict _DL_KINDS = {code: kind for kind, code in _DL_CODES.items()}
cdef int _DL_BFLOAT = 4  # kDLBfloat


def dl_dtype(dtype):
    """(code, bits, lanes) of a NumPy dtype whose values travel as memory,
    or None."""
    code = _DL_CODES.get(dtype.kind)
    if code is not None and (dtype.isnative or dtype.itemsize == 1):
        return code, dtype.itemsize * 8, 1
    if dtype.kind == "V" and dtype.name == "bfloat16" and dtype.names is None:
        return _DL_BFLOAT, 16, 1
    return None


def np_dtype(int code, int bits):
    """The NumPy dtype of a record's (code, bits): dl_dtype's inverse."""
    if code == _DL_BFLOAT and bits == 16:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    kind = _DL_KINDS.get(code)
    if kind is None or bits % 8:
        raise ValueError(f"pyfunc_bridge: a tensor of DLPack dtype ({code}, {bits}) "
                         f"cannot cross the ring")
    return np.dtype(f"{kind}{bits // 8}")


include "route.pxi"


def native_reply(uintptr_t address):
    """The Reply of the DONE of a finished native call (a PfbDispatchCall*
    whose state is DONE, still its caller's: the kernel hands it to the
    pool's Python path to decode): its result blocks are the Reply's."""
    cdef PfbDispatchCall* call = <PfbDispatchCall*>address
    if call == NULL or call.state != PFB_DISPATCH_DONE or call.reply == NULL:
        raise ValueError("pyfunc_bridge: not a completed native call")
    return _reply(call)


def set_counting(bint on):
    """Whether routes count their calls (pfb.enable_stats)."""
    pfb_dispatch_set_counting(on)


cdef class Dispatcher:
    """The parent's native side of a pool's rings (src/pool/dispatch.h): a
    call's inputs are copied into the input arena, its CALL posted and its
    DONE received by a reply thread per worker, all in C without the GIL.
    This class is its Python face (tests, and the pool's lifetime calls:
    attach, lost, register); the kernel calls dispatch.h itself.

    ``call`` submits and waits with the GIL released and returns the DONE
    as (Message, NativeArena of its result blocks)."""
    cdef PfbDispatch* _d
    cdef bint _disowned  # a forked child's copy: never deleted (disown)
    cdef bint _closed    # close() deleted it: this object keeps a reference
    cdef _Held _inputs
    cdef dict _held   # worker index -> (channel, _Held of its result arena)

    def __cinit__(self, input_buffer, int workers):
        self._inputs = _Held(input_buffer)
        self._held = {}
        self._d = pfb_dispatch_new(<char*>self._inputs.view.buf, self._inputs.view.len, workers)
        if self._d == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self._d == NULL or self._disowned:
            return
        if self._closed:
            pfb_dispatch_release(self._d)
        else:
            pfb_dispatch_delete(self._d)

    def close(self):
        """Closes it now (dispatch.h, pfb_dispatch_delete): the calls in
        flight and the queued ones fail ("the pool was closed"), later ones
        are refused.  Its memory stays until this object goes (a thread of
        ``call`` may still finish its call)."""
        if self._closed or self._disowned:
            return
        self._closed = True
        pfb_dispatch_retain(self._d)  # this object's, for the methods called after
        with nogil:
            pfb_dispatch_delete(self._d)

    @property
    def address(self):
        """The PfbDispatch*, for the kernel (alive as long as this object)."""
        return <uintptr_t>self._d

    def disown(self):
        """In a forked child: refuses every call from now on, touching
        nothing of the parent's (dispatch.h); never freed."""
        if not self._disowned:
            pfb_dispatch_disown(self._d)
            self._disowned = True

    def route(self, uint64_t token, uint32_t flags):
        """A Route to the function of `token` (registered) for CALLs with
        `flags` (PFB_POOL_CALL_*)."""
        cdef Route made = Route.__new__(Route)
        made._r = pfb_dispatch_route_new(self._d, token, flags)
        if made._r == NULL:
            raise MemoryError()
        return made

    def forget(self, uint64_t token):
        pfb_dispatch_forget(self._d, token)

    def attach(self, int index, Channel channel not None, int doorbell, results,
               uint64_t generation):
        cdef _Held held = _Held(results)
        cdef int rc = pfb_dispatch_attach(self._d, index, channel._control, doorbell,
                                          <const char*>held.view.buf, held.view.len,
                                          generation)
        if rc:
            raise OSError(rc, f"pyfunc_bridge: attaching worker {index} failed")
        self._held[index] = (channel, held)

    def lost(self, int index, int32_t code, str message, bint resend=False):
        """Worker `index` ended: its calls fail with (`code`, `message`);
        with `resend` (it died), those it had not started end RESEND."""
        cdef bytes text = message.encode("utf-8", "replace")
        cdef const char* c_text = text
        with nogil:
            pfb_dispatch_lost(self._d, index, code, c_text, resend)
        # The channel (its control segment's mapping) stays until the slot
        # is attached again: a submit that read `attached` a moment before
        # lost() may still read the segment's running call (choose()).

    def register(self, uint64_t token, const unsigned char[::1] payload):
        if pfb_dispatch_register(self._d, token, &payload[0] if payload.shape[0] else NULL,
                                 payload.shape[0]):
            raise MemoryError()

    def knows(self, uint64_t token):
        return bool(pfb_dispatch_knows(self._d, token))

    cdef PfbDispatchInput* _inputs_of(self, arrays, int64_t* dims, list keep) except NULL:
        cdef Py_ssize_t n = len(arrays), i
        cdef cnp.ndarray arr
        cdef PfbDispatchInput* inputs = <PfbDispatchInput*>calloc(max(n, 1),
                                                                  sizeof(PfbDispatchInput))
        if inputs == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                arr = arrays[i]
                if (not PyArray_IS_C_CONTIGUOUS(<PyArrayObject*>arr)
                        or arr.ndim > PFB_POOL_MAX_NDIM or arr.dtype.kind not in "iufcb"):
                    raise ValueError("pyfunc_bridge: dispatch takes C-contiguous arrays of "
                                     "numbers")
                keep.append(arr)
                inputs[i].data = cnp.PyArray_DATA(arr)
                inputs[i].nbytes = cnp.PyArray_NBYTES(arr)
                inputs[i].code = _DL_CODES[arr.dtype.kind]
                inputs[i].bits = arr.dtype.itemsize * 8
                inputs[i].lanes = 1
                inputs[i].ndim = arr.ndim
                inputs[i].dims = &dims[i * PFB_POOL_MAX_NDIM]
                for d in range(arr.ndim):
                    dims[i * PFB_POOL_MAX_NDIM + d] = arr.shape[d]
        except BaseException:
            free(inputs)
            raise
        return inputs

    def call(self, uint64_t token, arrays, uint32_t flags=0, timeout=None, wait=None):
        """Submits (waiting up to `timeout` seconds for room) and waits up to
        `wait` seconds (None: no limit) for the DONE; a call not done by
        then is abandoned (pfb_dispatch_finish) and TimeoutError raised."""
        cdef Py_ssize_t n = len(arrays)
        cdef int64_t* dims = <int64_t*>calloc(max(n, 1) * PFB_POOL_MAX_NDIM, sizeof(int64_t))
        cdef PfbDispatchInput* inputs = NULL
        cdef PfbDispatchCall call
        cdef int rc
        cdef int64_t limit = _timeout_ns(timeout)
        cdef int64_t waiting = _timeout_ns(wait)
        cdef bint abandoned = False
        keep = []
        if dims == NULL:
            raise MemoryError()
        try:
            inputs = self._inputs_of(arrays, dims, keep)
            with nogil:
                while True:
                    rc = pfb_dispatch_submit(self._d, token, flags, inputs, <uint32_t>n,
                                             limit, &call)
                    if rc:
                        break
                    if pfb_dispatch_wait(&call, waiting) == ETIMEDOUT:
                        pfb_dispatch_finish(self._d, &call)
                        abandoned = True
                        break
                    if call.state != PFB_DISPATCH_RESEND:
                        break
                    pfb_dispatch_finish(self._d, &call)  # never started: sent anew
            if rc:
                raise OSError(rc, f"pyfunc_bridge: dispatching the call failed ({rc})")
            if abandoned:
                raise TimeoutError(f"pyfunc_bridge: the call was not done within {wait} s "
                                   "(abandoned)")
            try:
                if call.state == PFB_DISPATCH_FAILED:
                    raise DispatchFailed(call.error_code, call.error.decode("utf-8", "replace"))
                return _decode_message(call.reply), _native_arena(call.arena)
            finally:
                pfb_dispatch_finish(self._d, &call)
        finally:
            free(inputs)
            free(dims)

    def call_many(self, uint64_t token, arrays, Py_ssize_t times, uint32_t flags=0):
        """Runs the call `times` times, one after another, entirely in C
        without the GIL (each DONE's result blocks handed back at once): the
        (worker start, worker end) CLOCK_REALTIME ns of each, or None for a
        call that failed.  For tests and measurements of the native path."""
        cdef Py_ssize_t n = len(arrays), k
        cdef int64_t* dims = <int64_t*>calloc(max(n, 1) * PFB_POOL_MAX_NDIM, sizeof(int64_t))
        cdef uint64_t* stamps = <uint64_t*>calloc(max(times, 1) * 2, sizeof(uint64_t))
        cdef PfbDispatchInput* inputs = NULL
        cdef PfbDispatchCall call
        cdef int rc = 0
        keep = []
        if dims == NULL or stamps == NULL:
            free(dims)
            free(stamps)
            raise MemoryError()
        try:
            inputs = self._inputs_of(arrays, dims, keep)
            with nogil:
                for k in range(times):
                    rc = pfb_dispatch_submit(self._d, token, flags, inputs, <uint32_t>n, -1,
                                             &call)
                    if rc:
                        break
                    pfb_dispatch_wait(&call, -1)
                    if call.state == PFB_DISPATCH_DONE:
                        stamps[2 * k] = call.reply[0].message.stamp
                        stamps[2 * k + 1] = call.reply[0].message.ended
                        pfb_dispatch_reply_back(&call)
                    pfb_dispatch_finish(self._d, &call)
            if rc:
                raise OSError(rc, f"pyfunc_bridge: dispatching call {k} failed ({rc})")
            return [(stamps[2 * k], stamps[2 * k + 1]) if stamps[2 * k + 1] else None
                    for k in range(times)]
        finally:
            free(inputs)
            free(dims)
            free(stamps)

    def alloc(self, uint64_t nbytes):
        """(offset, size) of an input-arena block for the pool's Python
        path, or None: the arena is shared with the native calls."""
        cdef uint64_t offset, size
        if pfb_dispatch_alloc(self._d, nbytes, &offset, &size):
            return None
        return offset, size

    def free(self, uint64_t offset, uint64_t size=0):
        """Frees a block that alloc gave (`size`: unused, the allocator
        knows it; the pool's old allocator took it)."""
        if pfb_dispatch_free(self._d, offset):
            raise ValueError(f"pyfunc_bridge: no live input block starts at offset {offset}")

    def free_bytes(self):
        return pfb_dispatch_free_bytes(self._d)

    def counts(self):
        cdef PfbDispatchCounts c
        pfb_dispatch_counts(self._d, &c)
        return {"calls": c.calls, "loads": c.loads, "doorbells": c.doorbells,
                "reply_sleeps": c.reply_sleeps, "input_blocks": c.input_blocks,
                "resent": c.resent, "queued": c.queued}


# ------------------------------------------------------------ ResultArena --

# PfbArenaBlock.user of a result block: its state, and the call that made it.
cdef enum:
    _ARRAY = 1      # a NumPy array of this worker holds it (freed when the array goes)
    _SENT = 2       # the parent holds it (until it hands it back)
    _CALL_SHIFT = 8  # the rest: the call during which it was allocated


cdef struct _Handler:
    # First: NumPy reads the handler through the capsule's pointer.
    PyDataMem_Handler numpy
    # The arena's bookkeeping; every access holds `lock` (arrays die on any
    # thread, and the handler runs without the GIL).
    pthread_mutex_t lock
    PfbArena* arena
    char* base           # this process's mapping of the result arena
    uint64_t bytes
    uint64_t min_bytes   # smaller allocations use the ordinary allocator
    uint64_t call        # the call running now (numbered from 1)
    uint64_t placed      # allocations placed in the arena
    uint64_t fell_back   # allocations of min_bytes or more that did not fit
    Py_buffer view       # keeps the mapping (an mmap cannot close while exported)
    bint has_view


cdef inline bint _in_arena(_Handler* h, const void* p) noexcept nogil:
    return h.base <= <const char*>p < h.base + h.bytes


cdef void* _arena_malloc(_Handler* h, size_t size) noexcept nogil:
    """An arena block for a NumPy array, or NULL (small, or no room)."""
    cdef uint64_t offset, got
    if size < h.min_bytes:
        return NULL
    pthread_mutex_lock(&h.lock)
    if pfb_arena_alloc(h.arena, size, &offset, &got) != 0:
        h.fell_back += 1
        pthread_mutex_unlock(&h.lock)
        return NULL
    pfb_arena_find(h.arena, offset).user = _ARRAY | (h.call << _CALL_SHIFT)
    h.placed += 1
    pthread_mutex_unlock(&h.lock)
    return h.base + offset


cdef void _arena_release(_Handler* h, void* p) noexcept nogil:
    """A NumPy array's arena block is free of the array: back to the arena
    unless the parent holds it (then its hand-back frees it)."""
    cdef uint64_t offset = <char*>p - h.base
    pthread_mutex_lock(&h.lock)
    cdef PfbArenaBlock* block = pfb_arena_find(h.arena, offset)
    # Anything else is not an array's block (NumPy frees only what it
    # allocated): left alone rather than corrupting the bookkeeping.
    if block != NULL and block.offset == offset and block.user & _ARRAY:
        block.user &= ~(<uint64_t>_ARRAY)
        if not block.user & _SENT:
            pfb_arena_free(h.arena, offset)
    pthread_mutex_unlock(&h.lock)


cdef void* _handler_malloc(void* ctx, size_t size) noexcept nogil:
    cdef void* p = _arena_malloc(<_Handler*>ctx, size)
    return p if p != NULL else malloc(size if size else 1)


cdef void* _handler_calloc(void* ctx, size_t nelem, size_t elsize) noexcept nogil:
    if elsize and nelem > SIZE_MAX // elsize:
        return NULL
    cdef size_t size = nelem * elsize
    cdef void* p = _arena_malloc(<_Handler*>ctx, size)
    if p != NULL:
        memset(p, 0, size)  # a reused block holds an earlier call's bytes
        return p
    return calloc(size if size else 1, 1)


cdef void* _handler_realloc(void* ctx, void* p, size_t size) noexcept nogil:
    cdef _Handler* h = <_Handler*>ctx
    cdef uint64_t held = 0
    cdef PfbArenaBlock* block
    cdef void* moved
    if p == NULL:
        return _handler_malloc(ctx, size)
    if not _in_arena(h, p):
        return realloc(p, size if size else 1)
    pthread_mutex_lock(&h.lock)
    block = pfb_arena_find(h.arena, <char*>p - h.base)
    if block != NULL:
        held = block.size - <uint64_t>(<char*>p - h.base - block.offset)
    pthread_mutex_unlock(&h.lock)
    if size <= held:
        return p  # the block has room (or the array shrinks)
    moved = _handler_malloc(ctx, size)
    if moved == NULL:
        return NULL  # realloc's contract: `p` stays valid
    memcpy(moved, p, held)
    _arena_release(h, p)
    return moved


cdef void _handler_free(void* ctx, void* p, size_t size) noexcept nogil:
    cdef _Handler* h = <_Handler*>ctx
    if p != NULL and _in_arena(h, p):
        _arena_release(h, p)
    else:
        free(p)


cdef void _destroy_handler_parts(_Handler* h) noexcept:
    # The mapping may close once the view is released.
    if h.has_view:
        PyBuffer_Release(&h.view)
    pfb_arena_delete(h.arena)
    pthread_mutex_destroy(&h.lock)
    free(h)


cdef void _destroy_handler(object capsule) noexcept:
    # Runs when the last array allocated through the handler and the
    # ResultArena are gone (each holds the capsule): nothing can reach the
    # arena any more.
    cdef _Handler* h = <_Handler*>PyCapsule_GetPointer(capsule, "mem_handler")
    if h != NULL:
        _destroy_handler_parts(h)


cdef Py_ssize_t _weaklist_offset = (<PyTypeWeaklist*>&PyArray_Type).tp_weaklistoffset


cdef inline bint _weakly_referenced(PyObject* arr) noexcept:
    return (_weaklist_offset > 0
            and (<PyObject**>(<char*>arr + _weaklist_offset))[0] != NULL)


cdef class ResultArena:
    """A worker's result arena (a writable buffer: the mapping of its memfd)
    with its block allocator and NumPy data-memory handler.

    ``call(func, args)`` runs ``func(*args)`` with the handler installed in
    this thread's context: NumPy arrays of at least `min_bytes` (default
    64 KiB) that the function makes are allocated in the arena (what does not
    fit goes to the ordinary allocator), and the handler is uninstalled when
    it returns.
    ``take(result)`` then hands a result to the parent without a copy, if its
    memory came from the arena during that call and nothing else in this
    worker can reach it (no other reference to it or to the arrays it views,
    no weak reference); anything else is copied (``reserve``) by the caller.
    An arena block freed by NumPy goes back at once, unless the parent holds
    it: then when both have let go (``hand_back``).

    >>> import mmap, numpy as np
    >>> results = ResultArena(mmap.mmap(-1, 1 << 20), min_bytes=1)
    >>> out = results.call(np.ones, (1000,))
    >>> results.contains(out), results.take(out)
    (True, (0, 8000))
    """
    cdef _Handler* _h
    cdef object _capsule   # owns _h; arrays allocated through it hold it too
    cdef dict _exclusive   # id(result) -> its block's offset, for the last call

    def __cinit__(self, buffer, uint64_t min_bytes=65536):
        cdef _Handler* h = <_Handler*>calloc(1, sizeof(_Handler))
        if h == NULL:
            raise MemoryError()
        try:
            PyObject_GetBuffer(buffer, &h.view, PyBUF_WRITABLE)
            h.has_view = True
            if <uintptr_t>h.view.buf % PFB_POOL_ALIGN:
                raise ValueError(f"pyfunc_bridge: a result arena must start on a "
                                 f"{PFB_POOL_ALIGN}-byte boundary (an mmap does)")
            h.arena = pfb_arena_new(h.view.len)
            if h.arena == NULL:
                raise MemoryError()
        except BaseException:
            if h.has_view:
                PyBuffer_Release(&h.view)
            free(h)
            raise
        pthread_mutex_init(&h.lock, NULL)
        h.base = <char*>h.view.buf
        h.bytes = pfb_arena_bytes(h.arena)
        h.min_bytes = min_bytes
        strncpy(h.numpy.name, HANDLER_NAME.encode(), sizeof(h.numpy.name) - 1)
        h.numpy.version = 1
        h.numpy.allocator.ctx = h
        h.numpy.allocator.malloc = _handler_malloc
        h.numpy.allocator.calloc = _handler_calloc
        h.numpy.allocator.realloc = _handler_realloc
        h.numpy.allocator.free = _handler_free
        try:
            self._capsule = PyCapsule_New(h, "mem_handler", _destroy_handler)
        except BaseException:
            _destroy_handler_parts(h)
            raise
        self._h = h  # the capsule owns it from here
        self._exclusive = {}

    @property
    def size(self):
        return self._h.bytes

    @property
    def address(self):
        """This process's address of the arena's first byte."""
        return <uintptr_t>self._h.base

    @property
    def handler(self):
        """The NumPy handler (a "mem_handler" capsule)."""
        return self._capsule

    @property
    def placed(self):
        """Allocations NumPy placed in the arena."""
        return self._h.placed

    @property
    def fell_back(self):
        """Allocations of min_bytes or more that did not fit the arena."""
        return self._h.fell_back

    def free_bytes(self):
        pthread_mutex_lock(&self._h.lock)
        n = pfb_arena_free_bytes(self._h.arena)
        pthread_mutex_unlock(&self._h.lock)
        return n

    def live_blocks(self):
        pthread_mutex_lock(&self._h.lock)
        n = pfb_arena_live_blocks(self._h.arena)
        pthread_mutex_unlock(&self._h.lock)
        return n

    def contains(self, cnp.ndarray arr not None):
        """Whether `arr`'s data lies in the arena."""
        return _in_arena(self._h, cnp.PyArray_DATA(arr))

    def call(self, func, args):
        """``func(*args)`` with the arena's handler installed (in this
        thread's context; uninstalled when it returns or raises)."""
        cdef _Handler* h = self._h
        pthread_mutex_lock(&h.lock)
        h.call += 1
        pthread_mutex_unlock(&h.lock)
        self._exclusive.clear()
        previous = PyDataMem_SetHandler(self._capsule)
        try:
            result = func(*args)
        finally:
            PyDataMem_SetHandler(previous)
        # Judged now, while the references are exactly those the function
        # left: `result` (this frame's) and a tuple's or list's own.
        self._judge(<PyObject*>result)
        return result

    cdef void _judge(self, PyObject* result) except *:
        cdef Py_ssize_t i
        if Py_REFCNT(result) != 1:
            return  # the function (or something it called) kept the result
        if PyTuple_CheckExact(<object>result):
            for i in range(PyTuple_GET_SIZE(<object>result)):
                self._consider(<PyObject*>PyTuple_GET_ITEM(<object>result, i))
        elif PyList_CheckExact(<object>result):
            for i in range(PyList_GET_SIZE(<object>result)):
                self._consider(<PyObject*>PyList_GET_ITEM(<object>result, i))
        else:
            self._consider(result)

    cdef void _consider(self, PyObject* obj) except *:
        """Records `obj` as exclusive when its memory is a block this call
        allocated and only its one referrer (the result, or its container)
        can reach it."""
        cdef _Handler* h = self._h
        cdef PyObject* last = obj
        cdef PyObject* base
        cdef PfbArenaBlock* block
        cdef uint64_t offset
        cdef bint fresh
        cdef void* data
        if Py_TYPE(obj) != &PyArray_Type or Py_REFCNT(obj) != 1 or _weakly_referenced(obj):
            return
        base = PyArray_BASE(<PyArrayObject*>obj)
        while base != NULL and PyArray_Check(base):
            if Py_REFCNT(base) != 1 or _weakly_referenced(base):
                return  # another view, or a name, reaches the memory
            last = base
            base = PyArray_BASE(<PyArrayObject*>base)
        if base != NULL or not PyArray_FLAGS(<PyArrayObject*>last) & NPY_ARRAY_OWNDATA:
            return  # memory NumPy did not allocate (a buffer, an input's view)
        data = PyArray_DATA(<PyArrayObject*>obj)
        if (not _in_arena(h, data) or not PyArray_IS_C_CONTIGUOUS(<PyArrayObject*>obj)
                or PyArray_NBYTES(<PyArrayObject*>obj) == 0):
            return
        offset = <char*>data - h.base
        pthread_mutex_lock(&h.lock)
        block = pfb_arena_find(h.arena, offset)
        fresh = (block != NULL and block.offset == offset and block.user & _ARRAY
                 and not block.user & _SENT and block.user >> _CALL_SHIFT == h.call
                 and <uint64_t>PyArray_NBYTES(<PyArrayObject*>obj) <= block.size)
        pthread_mutex_unlock(&h.lock)
        if fresh:
            self._exclusive[<uintptr_t>obj] = offset

    def take(self, value):
        """The block of `value`, a result of the last ``call``, when it may be
        handed over as it is: ``(offset, size)``, from now on the parent's
        (post it, or give it back with ``hand_back``).  None otherwise: the
        caller copies it (``reserve``)."""
        cdef _Handler* h = self._h
        cdef PfbArenaBlock* block
        cdef bint ok
        cdef uint64_t size = 0
        offset = self._exclusive.pop(<uintptr_t><PyObject*>value, None)
        if offset is None or not isinstance(value, cnp.ndarray):
            return None
        if <char*>cnp.PyArray_DATA(value) != h.base + <uint64_t>offset:
            return None
        pthread_mutex_lock(&h.lock)
        block = pfb_arena_find(h.arena, offset)
        ok = block != NULL and block.user & _ARRAY and not block.user & _SENT
        if ok:
            block.user |= _SENT
            size = block.size
        pthread_mutex_unlock(&h.lock)
        return (offset, size) if ok else None

    def reserve(self, uint64_t nbytes):
        """A fresh block for a copy of a result, already the parent's (post
        it, or give it back with ``hand_back``): (offset, size), or None when
        the arena has no room."""
        cdef _Handler* h = self._h
        cdef uint64_t offset, size
        cdef int rc
        pthread_mutex_lock(&h.lock)
        rc = pfb_arena_alloc(h.arena, nbytes, &offset, &size)
        if rc == 0:
            pfb_arena_find(h.arena, offset).user = _SENT | (h.call << _CALL_SHIFT)
        pthread_mutex_unlock(&h.lock)
        return (offset, size) if rc == 0 else None

    def hand_back(self, uint64_t offset):
        """The parent no longer holds the block at `offset`: it is freed (now,
        or when this worker's own array over it goes).  ValueError for a
        block the parent does not hold (handed back twice, or never sent)."""
        cdef _Handler* h = self._h
        cdef PfbArenaBlock* block
        cdef bint ok
        pthread_mutex_lock(&h.lock)
        block = pfb_arena_find(h.arena, offset)
        ok = block != NULL and block.offset == offset and block.user & _SENT
        if ok:
            block.user &= ~(<uint64_t>_SENT)
            if not block.user & _ARRAY:
                pfb_arena_free(h.arena, offset)
        pthread_mutex_unlock(&h.lock)
        if not ok:
            raise ValueError(f"pyfunc_bridge: result block {offset} was handed back, but "
                             f"the parent does not hold it (handed back twice, or never "
                             f"sent)")
