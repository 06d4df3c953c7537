# The one declaration of arena.h, the arenas' block allocator.
from libc.stdint cimport uint64_t

cdef extern from "arena.h" nogil:
    ctypedef struct PfbArena:
        pass

    ctypedef struct PfbArenaBlock:
        uint64_t offset
        uint64_t size
        uint64_t user

    PfbArena* pfb_arena_new(uint64_t bytes)
    void pfb_arena_delete(PfbArena* arena)
    int pfb_arena_alloc(PfbArena* arena, uint64_t nbytes, uint64_t* offset, uint64_t* size)
    int pfb_arena_free(PfbArena* arena, uint64_t offset)
    PfbArenaBlock* pfb_arena_find(PfbArena* arena, uint64_t offset)
    uint64_t pfb_arena_bytes(const PfbArena* arena)
    uint64_t pfb_arena_free_bytes(const PfbArena* arena)
    size_t pfb_arena_live_blocks(const PfbArena* arena)
