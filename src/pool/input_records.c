/* A call's input records and their transport (input_records.h). */
#include "input_records.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void pfb_input_numbers(PfbDispatchInput* item, const void* data, uint64_t nbytes, uint8_t code,
                       uint8_t bits, uint16_t lanes, int32_t ndim, const int64_t* dims,
                       uint32_t call_flags, PfbInputCounts* counts) {
  PfbDispatchInput made = {data, nbytes, code, bits, lanes, 0, ndim, dims};
  *item = made;
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
  for (uint64_t j = 0; j < count; ++j, at += 8) {
    for (int b = 0; b < 8; ++b) at[b] = (char)((elements[j].size >> (8 * b)) & 0xff);
    memcpy(at + 8, elements[j].data, elements[j].size);
    at += elements[j].size;
  }
  PfbDispatchInput made = {block, 8 * count + data, 0, 0, 1, PFB_POOL_TENSOR_STRINGS, ndim, dims};
  *item = made;
  counts->bytes += data;
  counts->string_bytes += data;
  return block;
}

/* The input arena's bytes for input `i`'s block (none for a pulled one). */
static uint64_t block_bytes(const PfbDispatchInput* inputs, uint32_t i) {
  if (inputs[i].flags & PFB_POOL_TENSOR_SOCKET) return 0;
  return (inputs[i].nbytes + PFB_POOL_ALIGN - 1) / PFB_POOL_ALIGN * PFB_POOL_ALIGN;
}

int pfb_input_transport(PfbDispatchInput* inputs, uint32_t count, int rc, int fits,
                        uint64_t room, int moves) {
  if (rc != 0 && rc != ENOSPC && rc != E2BIG) return PFB_SEND_DECLINED;
  if (count >= 2 && !fits) return PFB_SEND_PACKED;
  if (rc == 0) return PFB_SEND_AS_IS;
  uint64_t need = 0;
  for (uint32_t i = 0; i < count; ++i) need += block_bytes(inputs, i);
  /* E2BIG, a second move, or inputs that fit the room in bytes but not in
   * its pieces: all of them go (room 0). */
  if (rc != ENOSPC || moves || need <= room) room = 0;
  int moved = 0;
  while (room == 0 || need > room) {  /* the largest block first (ties: the later input) */
    int64_t largest = -1;
    for (uint32_t i = 0; i < count; ++i) {
      if (!(inputs[i].flags & PFB_POOL_TENSOR_SOCKET) &&
          (largest < 0 || block_bytes(inputs, i) >= block_bytes(inputs, (uint32_t)largest)))
        largest = i;
    }
    if (largest < 0) break;
    need -= block_bytes(inputs, (uint32_t)largest);
    PfbDispatchInput pulled = {NULL, 0, 0, 0, 1, PFB_POOL_TENSOR_SOCKET, 0, NULL};
    inputs[largest] = pulled;
    moved = 1;
  }
  return moved ? PFB_SEND_MOVED : PFB_SEND_DECLINED;
}
