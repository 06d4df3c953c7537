# ---------------------------------------------------------------- Channel --
# A worker's control segment: its request and reply rings.

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


cdef class _Held:
    """A writable buffer's view, kept (the mapping cannot close meanwhile)."""
    cdef Py_buffer view

    def __cinit__(self, buffer):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE)

    def __dealloc__(self):
        PyBuffer_Release(&self.view)  # (a view never got has no obj: nothing to release)


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
    cdef _Held _held  # the control segment's buffer
    cdef PfbPoolControl* _control
    cdef PfbRing _rings[2]
    cdef PfbPoolSlot _scratch[PFB_POOL_MAX_MESSAGE_SLOTS]  # the message being built (post)
    cdef PfbPoolSlot _inbox[PFB_POOL_MAX_MESSAGE_SLOTS]    # the message being read (receive)

    def __cinit__(self, buffer, *, bint create=False, uint32_t ring_slots=0, int doorbell=-1):
        self._held = _Held(buffer)
        if <uintptr_t>self._held.view.buf % PFB_POOL_SLOT_BYTES:
            raise ValueError("pyfunc_bridge: a control segment must start on a cache line")
        self._control = <PfbPoolControl*>self._held.view.buf
        if not create:
            ring_slots = self._control.ring_slots
            if (self._control.magic != PFB_POOL_MAGIC
                    or self._control.version != PFB_POOL_LAYOUT_VERSION):
                raise ValueError("pyfunc_bridge: not a pool control segment of this "
                                 "version (magic or layout version differs)")
        if ring_slots < 2 or ring_slots & (ring_slots - 1) or ring_slots > (1 << 20):
            raise ValueError(f"pyfunc_bridge: ring_slots must be a power of two in "
                             f"[2, 2**20], got {ring_slots}")
        if <uint64_t>self._held.view.len < pfb_pool_control_bytes(ring_slots):
            raise ValueError(f"pyfunc_bridge: {self._held.view.len} bytes cannot hold a "
                             f"control segment of {ring_slots} slots per ring")
        if create:
            memset(self._control, 0, sizeof(PfbPoolControl))
            self._control.version = PFB_POOL_LAYOUT_VERSION
            self._control.ring_slots = ring_slots
        pfb_ring_attach(&self._rings[0], &self._control.requests,
                        pfb_pool_request_slots(self._control), ring_slots)
        pfb_ring_attach(&self._rings[1], &self._control.replies,
                        pfb_pool_reply_slots(self._control), ring_slots)
        # The request ring's producer (the parent) rings the worker's
        # eventfd, on which the worker polls with its socket.
        self._rings[0].doorbell = doorbell
        if create:
            # Last (the rings' words were zeroed with the rest above): a
            # control segment with the magic is complete.
            self._control.magic = PFB_POOL_MAGIC

    cdef PfbRing* _ring(self, int ring) except NULL:
        if ring != REQUESTS and ring != REPLIES:
            raise ValueError(f"ring must be REQUESTS (0) or REPLIES (1), got {ring}")
        return &self._rings[ring]

    @property
    def ring_slots(self):
        return self._rings[0].capacity

    def set_running(self, uint64_t call_id, uint64_t since_ns=0):
        """The worker's side: the call it runs now (0: none), and since when
        (CLOCK_MONOTONIC ns): the time first, so that a reader that sees the
        call sees its time.  A call counts as started here, before it runs,
        the first time it is set; setting it again moves only its time."""
        if call_id and call_id != pfb_load64(&self._control.running_call):
            pfb_store64(&self._control.ring_calls_started,
                        pfb_load64(&self._control.ring_calls_started) + 1)
        pfb_store64(&self._control.running_since, since_ns)
        pfb_store64(&self._control.running_call, call_id)

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

    def unread(self):
        """While requests wait unread on the request ring: (its consumer
        position, the calls the worker started); None when none wait.  The
        pool's watchdog tells a worker that serves no more by it."""
        cdef uint64_t head = pfb_load64(&self._control.requests.head)
        if pfb_load64(&self._control.requests.tail) == head:
            return None
        return head, pfb_load64(&self._control.ring_calls_started)

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
        return min(n, self._rings[0].capacity)

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

    def close(self):
        """Ends both rings: every wait, here and in the other process, returns."""
        pfb_ring_close(&self._rings[0])
        pfb_ring_close(&self._rings[1])

    cdef bint _wait(self, PfbRing* r, uint32_t room, int64_t left, uint32_t checks=0,
                    bint sliced=True) except -1:
        """Sleeps until `r` has room for `room` slots (0: until it has a
        message, after `checks` quick looks): True; False after `left` ns
        (-1: no limit).  `sliced`: in 50 ms slices that handle signals."""
        cdef int rc
        cdef int64_t part
        while True:
            part = _SLICE_NS if sliced and (left < 0 or left > _SLICE_NS) else left
            with nogil:
                rc = (pfb_ring_wait_room(r, room, part) if room
                      else pfb_ring_wait_items(r, part, checks))
            if rc == 0:
                return True
            if rc == EPIPE:
                raise ChannelClosed("pyfunc_bridge: the ring is closed")
            if rc == EMSGSIZE:
                raise ValueError(f"pyfunc_bridge: a message of {room} slots cannot fit "
                                 f"a ring of {r.capacity}")
            PyErr_CheckSignals()
            if left >= 0:
                left -= part
                if left <= 0:
                    return False
            checks = 0

    def post(self, int ring, int kind, items=(), *, uint64_t call_id=0, uint64_t token=0,
             uint32_t flags=0, uint32_t status=0, uint64_t stamp=0, block=(0, 0),
             timeout=None, uint64_t ended=0):
        """Publishes one message on `ring`, its `items` as a Message's (a
        CALL's or DONE's tensors, each (code, bits, lanes, flags, offset,
        size, shape); any other's words), waiting up to `timeout` seconds
        (None: no limit) for room; does not wake the consumer (``notify``
        once per batch).  True once posted, False after the timeout."""
        cdef PfbRing* r = self._ring(ring)
        cdef PfbPoolMessage* m = &self._scratch[0].message
        cdef PfbPoolTensor record
        cdef int64_t dims[PFB_POOL_MAX_NDIM]
        cdef int rc
        pfb_msg_init(self._scratch, <unsigned short>kind)
        m.call_id = call_id
        m.token = token
        m.flags = flags
        m.status = status
        m.stamp = stamp
        m.ended = ended
        m.block_offset = block[0]
        m.block_size = block[1]
        if kind not in _TENSOR_KINDS:
            for word in items:
                if pfb_msg_add_word(self._scratch, PFB_POOL_MAX_MESSAGE_SLOTS, word):
                    raise ValueError(f"pyfunc_bridge: {len(items)} words do not fit one "
                                     f"message")
        else:
            for code, bits, lanes, tflags, offset, size, shape in items:
                if len(shape) > PFB_POOL_MAX_NDIM:
                    raise ValueError(f"pyfunc_bridge: a tensor of {len(shape)} dimensions; "
                                     f"at most {PFB_POOL_MAX_NDIM} are supported")
                memset(&record, 0, sizeof(record))
                record.code, record.bits, record.lanes = code, bits, lanes
                record.flags, record.offset, record.size = tflags, offset, size
                record.ndim = len(shape)
                for d, n in enumerate(shape):
                    if n < 0:
                        raise ValueError(f"pyfunc_bridge: a negative dimension in {shape}")
                    dims[d] = n
                if pfb_msg_add_tensor(self._scratch, PFB_POOL_MAX_MESSAGE_SLOTS, &record, dims):
                    raise ValueError(f"pyfunc_bridge: {len(items)} tensors do not fit one "
                                     f"message")
        if not self._wait(r, m.slots, _timeout_ns(timeout)):
            return False
        rc = pfb_ring_write(r, self._scratch)
        if rc == EPIPE:
            raise ChannelClosed("pyfunc_bridge: the ring is closed")
        if rc != 0:  # EAGAIN cannot happen: this side is the only producer
            raise OSError(rc, f"pyfunc_bridge: writing a message failed ({rc})")
        return True

    def fits(self, tensors):
        """Whether a CALL or DONE of these tensor records (post's items)
        travels on this channel's rings (pfb_pool_message_fits, the rule the
        dispatcher's CALLs follow too); one that does not goes by the socket."""
        cdef uint64_t slots = 1
        for tensor in tensors:
            slots += pfb_pool_tensor_slots(len(tensor[6]))
        return pfb_pool_message_fits(slots, self._rings[0].capacity)

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
        return self._wait(self._ring(ring), 0, _timeout_ns(timeout), checks, interruptible)

    def spin(self, int ring, int64_t ns):
        """Looks at `ring` for up to `ns` ns, yielding the core between
        looks, without announcing a sleep: whether a message is there.  A
        message found so costs its producer no wake-up (the consumer's flag
        stays clear, so its notify does nothing)."""
        cdef PfbRing* r = self._ring(ring)
        cdef int64_t end = pfb_clock_ns(CLOCK_MONOTONIC) + ns
        cdef bint found
        with nogil:
            # sched_yield, not a pause loop: on a loaded 2-core VM the
            # producer may be waiting for this very core (a 50 µs pause loop
            # caught no more calls than none, docs/pool.md).
            while not pfb_ring_available(r) and pfb_clock_ns(CLOCK_MONOTONIC) < end:
                sched_yield()
            found = pfb_ring_available(r) != 0
        return found

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
            messages.append(_decode_message(self._inbox))
        return messages


cdef extern from "<sched.h>" nogil:
    int sched_yield()


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
            items.append(_tensor_item(&record, dims))
    else:
        for i in range(m.count):
            if pfb_msg_read_word(slots, i, &word):
                raise OSError(EPROTO, "pyfunc_bridge: a malformed words message")
            items.append(word)
    return _message(m, items)

