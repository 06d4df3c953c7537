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

