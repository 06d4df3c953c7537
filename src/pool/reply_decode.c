/* The decoder of a DONE (reply_decode.h). */
#include "reply_decode.h"

#include <errno.h>
#include <string.h>

#include "records.h"

/* The data's bytes of a numbers record, or UINT64_MAX when they overflow. */
static uint64_t data_bytes(const PfbPoolTensor* record, const int64_t* dims) {
  uint64_t bytes = ((uint64_t)record->bits * (record->lanes ? record->lanes : 1) + 7) / 8;
  for (int32_t d = 0; d < record->ndim; ++d)
    if (__builtin_mul_overflow(bytes, (uint64_t)dims[d], &bytes)) return UINT64_MAX;
  return bytes;
}

int pfb_reply_decode(const PfbPoolSlot* message, uint64_t arena_bytes, PfbReplyResult* out,
                     uint32_t room, uint32_t* decoded) {
  const PfbPoolMessage* m = &message[0].message;
  *decoded = 0;
  if (m->status == PFB_POOL_STATUS_ERROR && m->block_size) {
    if (room < 1) return EMSGSIZE;
    memset(&out[0], 0, sizeof(out[0]));
    out[0].record.flags = PFB_POOL_TENSOR_PICKLED;
    out[0].record.offset = m->block_offset;
    out[0].record.size = out[0].nbytes = m->block_size;
    if (!pfb_pool_block_holds(m->block_offset, m->block_size, m->block_size, arena_bytes))
      return ERANGE;
    *decoded = 1;
    return 0;
  }
  if (m->status != PFB_POOL_STATUS_OK) return 0;
  if (m->count > room) return EMSGSIZE;
  uint32_t cursor = 1;
  for (uint32_t i = 0; i < m->count; ++i) {
    PfbReplyResult* r = &out[i];
    *decoded = i;
    memset(r, 0, sizeof(*r));
    if (pfb_msg_read_tensor(message, &cursor, &r->record, r->dims) != 0) return EPROTO;
    const PfbPoolTensor* t = &r->record;
    const int numbers = !(t->flags & (PFB_POOL_TENSOR_STRINGS | PFB_POOL_TENSOR_PICKLED));
    r->nbytes = numbers ? data_bytes(t, r->dims) : t->size;
    if (!pfb_pool_block_holds(t->offset, t->size, r->nbytes, arena_bytes)) return ERANGE;
    r->saves_copy = numbers && r->nbytes != 0 && !(t->ndim == 0 && !(t->flags & PFB_POOL_TENSOR_SHARED));
    r->worker_copied = r->saves_copy && !(t->flags & PFB_POOL_TENSOR_SHARED) ? r->nbytes : 0;
  }
  *decoded = m->count;
  return 0;
}
