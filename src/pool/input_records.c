/* A call's input records and their transport (input_records.h). */
#include "input_records.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void describe(PfbDispatchInput* item, const void* data, uint64_t nbytes, uint32_t flags,
                     int32_t ndim, const int64_t* dims) {
  item->data = data;
  item->nbytes = nbytes;
  item->flags = flags;
  item->ndim = ndim;
  item->dims = dims;
}

void pfb_input_numbers(PfbDispatchInput* item, const void* data, uint64_t nbytes, uint8_t code,
                       uint8_t bits, uint16_t lanes, int32_t ndim, const int64_t* dims,
                       uint32_t call_flags, PfbInputCounts* counts) {
  describe(item, data, nbytes, 0, ndim, dims);
  item->code = code;
  item->bits = bits;
  item->lanes = lanes;
  counts->bytes += nbytes;
  if (!((call_flags & PFB_POOL_CALL_SCALARS) && ndim == 0)) counts->to_worker += nbytes;
}

char* pfb_input_strings(PfbDispatchInput* item, const PfbBytes* elements, uint64_t count,
                        int32_t ndim, const int64_t* dims, PfbInputCounts* counts) {
  uint64_t data = 0;
  for (uint64_t j = 0; j < count; ++j) data += elements[j].size;
  char* block = (char*)malloc(8 * count + data + 1);  /* (+1: an empty input's block too) */
  if (block == NULL) return NULL;
  char* at = block;
  for (uint64_t j = 0; j < count; ++j) {
    for (int b = 0; b < 8; ++b) *at++ = (char)((elements[j].size >> (8 * b)) & 0xff);
    memcpy(at, elements[j].data, elements[j].size);
    at += elements[j].size;
  }
  describe(item, block, (uint64_t)(at - block), PFB_POOL_TENSOR_STRINGS, ndim, dims);
  item->code = item->bits = 0;
  item->lanes = 1;
  counts->bytes += data;
  counts->string_bytes += data;
  return block;
}

/* A block's size and its input's index, sorted largest first (ties: the
 * later input first). */
typedef struct Sized {
  uint64_t size;
  uint32_t index;
} Sized;

static int larger_first(const void* a, const void* b) {
  const Sized* x = (const Sized*)a;
  const Sized* y = (const Sized*)b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return x->index > y->index ? -1 : x->index < y->index;
}

int pfb_input_transport(const PfbDispatchInput* inputs, uint32_t count, int rc, int fits,
                        uint64_t room, int moves, uint8_t* to_socket) {
  if (rc != 0 && rc != ENOSPC && rc != E2BIG) return PFB_SEND_DECLINED;
  if (count >= 2 && !fits) return PFB_SEND_PACKED;
  if (rc == 0) return PFB_SEND_AS_IS;
  if (rc != ENOSPC || moves) room = 0;  /* (E2BIG, or moved once already: all of them) */
  Sized* blocks = (Sized*)malloc((count ? count : 1) * sizeof(Sized));
  if (blocks == NULL) return PFB_SEND_DECLINED;
  uint32_t n = 0;
  uint64_t need = 0;
  for (uint32_t i = 0; i < count; ++i) {
    to_socket[i] = 0;
    if (inputs[i].flags & PFB_POOL_TENSOR_SOCKET) continue;
    blocks[n].size = (inputs[i].nbytes + PFB_POOL_ALIGN - 1) / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
    blocks[n].index = i;
    need += blocks[n++].size;
  }
  qsort(blocks, n, sizeof(Sized), larger_first);
  uint32_t moved = 0;
  for (; moved < n && !(room && need <= room); ++moved) {
    need -= blocks[moved].size;
    to_socket[blocks[moved].index] = 1;
  }
  if (moved == 0) {  /* they fit the room in bytes, not in its pieces: all go */
    for (; moved < n; ++moved) to_socket[blocks[moved].index] = 1;
  }
  free(blocks);
  return moved ? PFB_SEND_MOVED : PFB_SEND_DECLINED;
}
