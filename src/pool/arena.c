/* The arena allocator (arena.h): one array of the live blocks, sorted by
 * offset.  The free ranges are the gaps between them, so freed neighbours
 * coalesce by themselves and a free never needs memory.  A pool's arenas
 * hold tens to hundreds of blocks, so a scan and a memmove beat any tree
 * here. */
#include "arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm_layout.h"

struct PfbArena {
  uint64_t bytes;
  uint64_t free_bytes;
  PfbArenaBlock* live;  /* sorted by offset */
  size_t nlive;
  size_t capacity;
};

PfbArena* pfb_arena_new(uint64_t bytes) {
  PfbArena* arena = (PfbArena*)calloc(1, sizeof(PfbArena));
  if (arena == NULL) return NULL;
  arena->bytes = arena->free_bytes = bytes / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
  return arena;
}

void pfb_arena_delete(PfbArena* arena) {
  if (arena == NULL) return;
  free(arena->live);
  free(arena);
}

/* The bytes of the free range before live block `i` (`nlive`: after the
 * last one), 0 for none; its offset into *start. */
static uint64_t gap(const PfbArena* arena, size_t i, uint64_t* start) {
  uint64_t from = i == 0 ? 0 : arena->live[i - 1].offset + arena->live[i - 1].size;
  *start = from;
  return (i == arena->nlive ? arena->bytes : arena->live[i].offset) - from;
}

/* bsearch's order of an offset and a live block: equal when the block
 * holds it (live blocks never overlap). */
static int by_offset(const void* key, const void* item) {
  uint64_t offset = *(const uint64_t*)key;
  const PfbArenaBlock* block = (const PfbArenaBlock*)item;
  return offset < block->offset ? -1 : offset - block->offset >= block->size;
}

int pfb_arena_alloc(PfbArena* arena, uint64_t nbytes, uint64_t* offset, uint64_t* size) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes > arena->bytes) return ENOMEM;  /* also keeps the rounding below from overflowing */
  uint64_t need = (nbytes + PFB_POOL_ALIGN - 1) / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
  uint64_t at = 0;
  size_t i = 0;  /* first fit, from the lowest offset */
  while (i <= arena->nlive && gap(arena, i, &at) < need) ++i;
  if (i > arena->nlive) return ENOMEM;
  if (arena->nlive == arena->capacity) {
    size_t grown = arena->capacity ? 2 * arena->capacity : 16;
    PfbArenaBlock* moved = (PfbArenaBlock*)realloc(arena->live, grown * sizeof(PfbArenaBlock));
    if (moved == NULL) return ENOMEM;
    arena->live = moved;
    arena->capacity = grown;
  }
  memmove(&arena->live[i + 1], &arena->live[i], (arena->nlive - i) * sizeof(PfbArenaBlock));
  PfbArenaBlock made = {at, need, 0};
  arena->live[i] = made;
  ++arena->nlive;
  arena->free_bytes -= need;
  *offset = at;
  *size = need;
  return 0;
}

int pfb_arena_free(PfbArena* arena, uint64_t offset) {
  PfbArenaBlock* block = pfb_arena_find(arena, offset);
  if (block == NULL || block->offset != offset) return EINVAL;
  size_t j = (size_t)(block - arena->live);
  arena->free_bytes += block->size;
  memmove(&arena->live[j], &arena->live[j + 1], (arena->nlive - j - 1) * sizeof(PfbArenaBlock));
  --arena->nlive;
  return 0;
}

PfbArenaBlock* pfb_arena_find(PfbArena* arena, uint64_t offset) {
  if (arena->nlive == 0) return NULL;  /* (`live` may be NULL: bsearch wants an array) */
  return (PfbArenaBlock*)bsearch(&offset, arena->live, arena->nlive, sizeof(PfbArenaBlock),
                                 by_offset);
}

uint64_t pfb_arena_bytes(const PfbArena* arena) { return arena->bytes; }

uint64_t pfb_arena_free_bytes(const PfbArena* arena) { return arena->free_bytes; }

size_t pfb_arena_live_blocks(const PfbArena* arena) { return arena->nlive; }

