/* The block allocator of a pool's arenas (shm_layout.h): the parent's for the
 * input arena, each worker's for its result arena.  It manages offsets in
 * [0, bytes) and keeps its bookkeeping in the allocating process's own
 * memory; it never touches the arena's bytes.
 *
 * Blocks are PFB_POOL_ALIGN-aligned and a multiple of it long.  First fit
 * from the lowest offset: the same few blocks serve a steady stream of calls,
 * so their pages stay mapped and warm.  Freed neighbours coalesce (the free
 * ranges are the gaps between the live blocks).  Every
 * block handed out is recorded, so a free of an offset that is not a live
 * block (a peer's double or bogus hand-back) is refused instead of corrupting
 * the free list.
 *
 * Not thread-safe: each user wraps it in its own lock.  Plain C that also
 * compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_ARENA_H_
#define PYFUNC_BRIDGE_POOL_ARENA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PfbArena PfbArena;

/* A live block; `user` is the owner's to use (the NumPy handler keeps its
 * state bits there) and 0 when allocated. */
typedef struct PfbArenaBlock {
  uint64_t offset;
  uint64_t size;
  uint64_t user;
} PfbArenaBlock;

/* An allocator of `bytes` (rounded down to PFB_POOL_ALIGN); NULL when out of
 * memory. */
PfbArena* pfb_arena_new(uint64_t bytes);
void pfb_arena_delete(PfbArena* arena);

/* A block of at least `nbytes` (0 counts as 1): 0 and its offset and size, or
 * ENOMEM when no free range is large enough (or the bookkeeping cannot
 * grow). */
int pfb_arena_alloc(PfbArena* arena, uint64_t nbytes, uint64_t* offset, uint64_t* size);

/* Frees the block that starts at `offset`: 0, or EINVAL when no live block
 * starts there (nothing changes). */
int pfb_arena_free(PfbArena* arena, uint64_t offset);

/* The live block that contains byte `offset`, or NULL.  The pointer is valid
 * until the next alloc or free. */
PfbArenaBlock* pfb_arena_find(PfbArena* arena, uint64_t offset);

uint64_t pfb_arena_bytes(const PfbArena* arena);
uint64_t pfb_arena_free_bytes(const PfbArena* arena);
size_t pfb_arena_live_blocks(const PfbArena* arena);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_ARENA_H_ */
