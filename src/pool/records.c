/* Messages in local memory (records.h). */
#include "records.h"

#include <errno.h>
#include <string.h>

/* Dimension `d` of the record at `slot`: inline, then in PfbPoolDims slots. */
static const int64_t* dim_at(const PfbPoolSlot* slot, int32_t d) {
  if (d < PFB_POOL_INLINE_DIMS) return &slot->tensor.dims[d];
  d -= PFB_POOL_INLINE_DIMS;
  return &slot[1 + d / PFB_POOL_DIMS_PER_SLOT].dims.dims[d % PFB_POOL_DIMS_PER_SLOT];
}

void pfb_msg_init(PfbPoolSlot* out, uint16_t kind) {
  memset(&out[0], 0, sizeof(PfbPoolSlot));
  out[0].message.kind = kind;
  out[0].message.slots = 1;
}

int pfb_msg_add_tensor(PfbPoolSlot* out, uint32_t max_slots, const PfbPoolTensor* tensor,
                       const int64_t* dims) {
  if (tensor->ndim < 0 || tensor->ndim > PFB_POOL_MAX_NDIM) return EINVAL;
  uint32_t at = out[0].message.slots;
  uint32_t need = pfb_pool_tensor_slots(tensor->ndim);
  if (at + need > max_slots || at + need > UINT16_MAX) return EMSGSIZE;
  PfbPoolSlot* slot = &out[at];
  memset(slot, 0, need * sizeof(PfbPoolSlot));
  slot->tensor = *tensor;
  slot->tensor.reserved = 0;
  memset(slot->tensor.dims, 0, sizeof(slot->tensor.dims));
  for (int32_t d = 0; d < tensor->ndim; ++d) *(int64_t*)dim_at(slot, d) = dims[d];
  out[0].message.slots = (uint16_t)(at + need);
  ++out[0].message.count;
  return 0;
}

int pfb_msg_add_word(PfbPoolSlot* out, uint32_t max_slots, uint64_t word) {
  uint32_t count = out[0].message.count;
  uint32_t slot = 1 + count / PFB_POOL_WORDS_PER_SLOT;
  if (count % PFB_POOL_WORDS_PER_SLOT == 0) {  /* a fresh slot */
    if (slot + 1 > max_slots || slot + 1 > UINT16_MAX) return EMSGSIZE;
    memset(&out[slot], 0, sizeof(PfbPoolSlot));
    out[0].message.slots = (uint16_t)(slot + 1);
  }
  out[slot].words.words[count % PFB_POOL_WORDS_PER_SLOT] = word;
  out[0].message.count = count + 1;
  return 0;
}

int pfb_msg_read_tensor(const PfbPoolSlot* message, uint32_t* cursor, PfbPoolTensor* tensor,
                        int64_t* dims) {
  uint32_t at = *cursor;
  uint32_t slots = message[0].message.slots;
  if (at == 0 || at >= slots) return EPROTO;
  *tensor = message[at].tensor;
  if (tensor->ndim < 0 || tensor->ndim > PFB_POOL_MAX_NDIM) return EPROTO;
  uint32_t need = pfb_pool_tensor_slots(tensor->ndim);
  if (at + need > slots) return EPROTO;
  for (int32_t d = 0; d < tensor->ndim; ++d)
    if ((dims[d] = *dim_at(&message[at], d)) < 0) return EPROTO;
  *cursor = at + need;
  return 0;
}

int pfb_msg_read_word(const PfbPoolSlot* message, uint32_t index, uint64_t* word) {
  if (index >= message[0].message.count) return EPROTO;
  uint32_t slot = 1 + index / PFB_POOL_WORDS_PER_SLOT;
  if (slot >= message[0].message.slots) return EPROTO;
  *word = message[slot].words.words[index % PFB_POOL_WORDS_PER_SLOT];
  return 0;
}
