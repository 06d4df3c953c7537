# ------------------------------------------------------------------ Reply --
# A DONE as Python takes it: its Message and its result blocks, each the
# Reply's until claimed.

cdef class NativeArena:
    """A reference on a worker's result arena as the dispatcher maps it
    (PfbDispatchArena): while this object lives, the mapping does.  Result
    blocks go back to their worker by ``hand_back(offset)`` (the conversion
    layer's result views, worker_result, call it when they go)."""
    cdef PfbDispatchArena* _a

    def __dealloc__(self):
        pfb_dispatch_arena_drop(self._a)

    def hand_back(self, uint64_t offset):
        pfb_dispatch_arena_hand_back(self._a, offset)

    def array(self):
        """A read-only uint8 array over the whole mapping; it keeps this
        object, and so the mapping."""
        cdef cnp.npy_intp length = <cnp.npy_intp>self._a.bytes
        arr = cnp.PyArray_SimpleNewFromData(1, &length, cnp.NPY_UINT8, self._a.base)
        cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
        cnp.set_array_base(arr, self)
        return arr


cdef class Reply:
    """A DONE taken off its call, decoded by the one decoder of a DONE
    (reply_decode.h, which the kernel's native call uses too): its Message,
    each result's statistics (`counted`: (bytes, saves a copy, bytes the
    worker copied), by reply_decode.h's rule), and its result blocks (in
    `arena`, a NativeArena), each this object's until claimed, by ``read``
    (its bytes; the block goes back at once) or ``view`` (an array that
    hands it back when it goes).  The blocks nobody claimed go back when
    this object goes: an exception anywhere (Ctrl-C between two bytecodes)
    loses none, and a claim runs no bytecode.

    ``Reply(address)``: the Reply of a finished native call whose DONE the
    kernel hands to Python (a PfbDispatchCall*, DONE, still its caller's);
    Route.call makes its own."""
    cdef readonly object message
    cdef readonly object arena
    cdef readonly list counted
    cdef set _held  # offsets of the blocks not claimed yet
    cdef object _results  # arena.array(), made on the first claim

    def __init__(self, uintptr_t address):
        cdef PfbDispatchCall* call = <PfbDispatchCall*>address
        if call == NULL or call.state != PFB_DISPATCH_DONE or call.reply == NULL:
            raise ValueError("pyfunc_bridge: not a completed native call")
        self._take(call)

    def __dealloc__(self):
        if self._held and self.arena is not None:
            for offset in self._held:
                (<NativeArena>self.arena).hand_back(offset)

    cdef int _take(self, PfbDispatchCall* call) except -1:
        """Decodes the DONE of `call` (pfb_reply_decode): its result blocks
        are this object's from now on; one it refuses, it hands back."""
        cdef const PfbPoolMessage* m = &call.reply[0].message
        cdef uint32_t room = m.count if m.count else 1, decoded = 0, i
        cdef uint64_t arena_bytes = call.arena.bytes if call.arena != NULL else 0
        cdef PfbReplyResult* out = <PfbReplyResult*>malloc(room * sizeof(PfbReplyResult))
        cdef PfbReplyResult* r
        cdef NativeArena arena
        cdef int rc = pfb_reply_decode(call.reply, arena_bytes, out, room, &decoded) \
            if out != NULL else ENOMEM
        try:
            if rc:
                pfb_dispatch_reply_hand_back(call)
                if rc == ERANGE:
                    r = &out[decoded]
                    raise RuntimeError(
                        f"pyfunc_bridge: a worker described a result block ({r.record.offset}, "
                        f"{r.record.size}) that does not hold {r.nbytes} bytes in its "
                        f"{arena_bytes}-byte arena")
                if rc == ENOMEM:
                    raise MemoryError()
                raise OSError(EPROTO, "pyfunc_bridge: a malformed tensor record")
            self._held = set()
            items = []
            self.counted = []
            if call.arena != NULL:
                arena = self.arena = NativeArena.__new__(NativeArena)
                pfb_dispatch_arena_keep(call.arena)  # the NativeArena's own reference
                arena._a = call.arena
            for i in range(decoded):
                r = &out[i]
                if r.record.size and call.arena != NULL:  # (an empty result has no block)
                    self._held.add(r.record.offset)
                if m.status == PFB_POOL_STATUS_OK:  # (an error's one block: its pickle)
                    items.append(_tensor_item(&r.record, r.dims))
                    self.counted.append((r.nbytes, bool(r.saves_copy), r.worker_copied))
            self.message = _message(m, items)
        finally:
            free(out)
        return 0

    def read(self, uint64_t offset, uint64_t size):
        """The bytes of the block at `offset` (`size` used); it goes back."""
        if offset not in self._held:
            raise ValueError(f"pyfunc_bridge: no unclaimed result block at offset {offset}")
        self._held.discard(offset)
        try:  # (checked with its record by pfb_reply_decode)
            return bytes(self._array()[offset:offset + size])
        finally:
            (<NativeArena>self.arena).hand_back(offset)

    def view(self, make_view, uint64_t offset, uint64_t size, dtype, shape):
        """make_view(arena, results, offset, size, dtype, shape): the
        conversion layer's worker_result, whose array owns the block."""
        made = make_view(self.arena, self._array(), offset, size, dtype, shape)
        self._held.discard(offset)
        return made

    cdef object _array(self):
        """The uint8 array over the result arena, one per Reply."""
        if self._results is None:
            self._results = self.arena.array()
        return self._results
