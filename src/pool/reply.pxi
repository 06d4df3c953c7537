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

    @property
    def index(self):
        return self._a.index

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
    """A DONE taken off its call (Route.call, native_reply): its Message, and
    its result blocks (in `arena`, a NativeArena), each this object's until
    claimed, by ``read`` (its bytes; the block goes back at once) or ``view``
    (an array that hands it back when it goes).  The blocks nobody claimed go
    back when this object goes: an exception anywhere (Ctrl-C between two
    bytecodes) loses none, and a claim runs no bytecode."""
    cdef readonly object message
    cdef readonly object arena
    cdef set _held  # offsets of the blocks not claimed yet
    cdef object _results  # arena.array(), made on the first claim

    def __dealloc__(self):
        if self._held and self.arena is not None:
            for offset in self._held:
                (<NativeArena>self.arena).hand_back(offset)

    def read(self, uint64_t offset, uint64_t size):
        """The bytes of the block at `offset` (`size` used); it goes back."""
        if offset not in self._held:
            raise ValueError(f"pyfunc_bridge: no unclaimed result block at offset {offset}")
        self._held.discard(offset)
        try:
            if not pfb_pool_block_holds(offset, size, size, (<NativeArena>self.arena)._a.bytes):
                raise RuntimeError(f"pyfunc_bridge: a worker described a block ({offset}, "
                                   f"{size}) outside its arena")
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


cdef Reply _reply(PfbDispatchCall* call):
    """The Reply of a DONE `call`: its blocks are the Reply's from now on."""
    cdef Reply made = Reply.__new__(Reply)
    cdef NativeArena arena
    made.message = _decode_message(call.reply)
    made._held = set()
    if call.arena != NULL:
        arena = made.arena = NativeArena.__new__(NativeArena)
        pfb_dispatch_arena_keep(call.arena)  # the NativeArena's own reference
        arena._a = call.arena
        for item in made.message.items:
            if item[5]:  # (its size: an empty result has no block)
                made._held.add(item[4])
        if made.message.status == PFB_POOL_STATUS_ERROR and made.message.block[1]:
            made._held.add(made.message.block[0])
    return made


def native_reply(uintptr_t address):
    """The Reply of the DONE of a finished native call (a PfbDispatchCall*
    whose state is DONE, still its caller's: the kernel hands it to the
    pool's Python path to decode): its result blocks are the Reply's."""
    cdef PfbDispatchCall* call = <PfbDispatchCall*>address
    if call == NULL or call.state != PFB_DISPATCH_DONE or call.reply == NULL:
        raise ValueError("pyfunc_bridge: not a completed native call")
    return _reply(call)

