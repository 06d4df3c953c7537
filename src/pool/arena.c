/* The arena allocator (arena.h): two arrays sorted by offset, the free
 * ranges and the live blocks.  A pool's arenas hold tens to hundreds of
 * blocks, so a scan and a memmove beat any tree here. */
#include "arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm_layout.h"

typedef struct PfbRange {
  uint64_t offset;
  uint64_t size;
} PfbRange;

struct PfbArena {
  uint64_t bytes;
  uint64_t free_bytes;
  PfbRange* free;  /* sorted, coalesced */
  size_t nfree;
  size_t free_capacity;
  PfbArenaBlock* live;  /* sorted */
  size_t nlive;
  size_t live_capacity;
};

/* Makes room for one more element; 0 or ENOMEM (nothing changed). */
static int reserve_one(void** items, size_t count, size_t* capacity, size_t item_size) {
  if (count < *capacity) return 0;
  size_t grown = *capacity ? 2 * *capacity : 16;
  void* moved = realloc(*items, grown * item_size);
  if (moved == NULL) return ENOMEM;
  *items = moved;
  *capacity = grown;
  return 0;
}

PfbArena* pfb_arena_new(uint64_t bytes) {
  PfbArena* arena = (PfbArena*)calloc(1, sizeof(PfbArena));
  if (arena == NULL) return NULL;
  arena->bytes = bytes / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
  if (arena->bytes > 0) {
    if (reserve_one((void**)&arena->free, 0, &arena->free_capacity, sizeof(PfbRange))) {
      free(arena);
      return NULL;
    }
    arena->free[0].offset = 0;
    arena->free[0].size = arena->bytes;
    arena->nfree = 1;
  }
  arena->free_bytes = arena->bytes;
  return arena;
}

void pfb_arena_delete(PfbArena* arena) {
  if (arena == NULL) return;
  free(arena->free);
  free(arena->live);
  free(arena);
}

/* The index of the first of `n` items (`stride` bytes each, an offset
 * first: PfbRange, PfbArenaBlock) at or after `offset`. */
static size_t lower_bound(const void* items, size_t n, size_t stride, uint64_t offset) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const uint64_t* at = (const uint64_t*)((const char*)items + mid * stride);
    if (*at < offset) lo = mid + 1; else hi = mid;
  }
  return lo;
}

int pfb_arena_alloc(PfbArena* arena, uint64_t nbytes, uint64_t* offset, uint64_t* size) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes > arena->bytes) return ENOMEM;  /* also keeps the rounding below from overflowing */
  uint64_t need = (nbytes + PFB_POOL_ALIGN - 1) / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
  size_t i = 0;
  while (i < arena->nfree && arena->free[i].size < need) ++i;
  if (i == arena->nfree) return ENOMEM;
  /* Grown before anything changes, so that a failure leaves both lists intact. */
  if (reserve_one((void**)&arena->live, arena->nlive, &arena->live_capacity,
                  sizeof(PfbArenaBlock)))
    return ENOMEM;
  PfbRange* range = &arena->free[i];
  uint64_t at = range->offset;
  if (range->size == need) {
    memmove(range, range + 1, (arena->nfree - i - 1) * sizeof(PfbRange));
    --arena->nfree;
  } else {
    range->offset += need;
    range->size -= need;
  }
  arena->free_bytes -= need;
  size_t j = lower_bound(arena->live, arena->nlive, sizeof(PfbArenaBlock), at);
  memmove(&arena->live[j + 1], &arena->live[j], (arena->nlive - j) * sizeof(PfbArenaBlock));
  arena->live[j].offset = at;
  arena->live[j].size = need;
  arena->live[j].user = 0;
  ++arena->nlive;
  *offset = at;
  *size = need;
  return 0;
}

int pfb_arena_free(PfbArena* arena, uint64_t offset) {
  size_t j = lower_bound(arena->live, arena->nlive, sizeof(PfbArenaBlock), offset);
  if (j == arena->nlive || arena->live[j].offset != offset) return EINVAL;
  uint64_t size = arena->live[j].size;
  size_t i = lower_bound(arena->free, arena->nfree, sizeof(PfbRange), offset);
  int joins_previous = i > 0 && arena->free[i - 1].offset + arena->free[i - 1].size == offset;
  int joins_next = i < arena->nfree && offset + size == arena->free[i].offset;
  /* A block between two used neighbours adds a range: room first. */
  if (!joins_previous && !joins_next &&
      reserve_one((void**)&arena->free, arena->nfree, &arena->free_capacity, sizeof(PfbRange)))
    return ENOMEM;
  memmove(&arena->live[j], &arena->live[j + 1], (arena->nlive - j - 1) * sizeof(PfbArenaBlock));
  --arena->nlive;
  arena->free_bytes += size;
  if (joins_previous && joins_next) {
    arena->free[i - 1].size += size + arena->free[i].size;
    memmove(&arena->free[i], &arena->free[i + 1], (arena->nfree - i - 1) * sizeof(PfbRange));
    --arena->nfree;
  } else if (joins_previous) {
    arena->free[i - 1].size += size;
  } else if (joins_next) {
    arena->free[i].offset = offset;
    arena->free[i].size += size;
  } else {
    memmove(&arena->free[i + 1], &arena->free[i], (arena->nfree - i) * sizeof(PfbRange));
    arena->free[i].offset = offset;
    arena->free[i].size = size;
    ++arena->nfree;
  }
  return 0;
}

PfbArenaBlock* pfb_arena_find(PfbArena* arena, uint64_t offset) {
  /* The last block that starts at or before `offset`. */
  size_t j = lower_bound(arena->live, arena->nlive, sizeof(PfbArenaBlock), offset + 1);
  if (j == 0) return NULL;
  PfbArenaBlock* block = &arena->live[j - 1];
  return offset - block->offset < block->size ? block : NULL;
}

uint64_t pfb_arena_bytes(const PfbArena* arena) { return arena->bytes; }

uint64_t pfb_arena_free_bytes(const PfbArena* arena) { return arena->free_bytes; }

uint64_t pfb_arena_largest_free(const PfbArena* arena) {
  uint64_t largest = 0;
  for (size_t i = 0; i < arena->nfree; ++i)
    if (arena->free[i].size > largest) largest = arena->free[i].size;
  return largest;
}

size_t pfb_arena_live_blocks(const PfbArena* arena) { return arena->nlive; }

size_t pfb_arena_free_ranges(const PfbArena* arena) { return arena->nfree; }
