/* Building and reading the messages of the rings (shm_layout.h) in this
 * process's own memory: a message is built in a local array of slots, then
 * copied into a ring by pfb_ring_write; pfb_ring_read copies one out, and it
 * is read here.  Reading validates everything against the message's own slot
 * count: a malformed message is EPROTO, never a read out of bounds.
 *
 * Plain C that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_RECORDS_H_
#define PYFUNC_BRIDGE_POOL_RECORDS_H_

#include <stdint.h>

#include "shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The slots of the longest message a side builds or reads: a CALL or DONE of
 * many tensors of many dimensions spans several batches of words. */
#define PFB_POOL_MAX_MESSAGE_SLOTS 1024

/* Whether a message of `slots` slots travels on a ring of `ring_slots`
 * (0: none known yet, so only the longest message counts): the one rule for
 * both directions.  A CALL that does not goes packed (PFB_POOL_CALL_PACKED,
 * dispatch_submit.c and input_records.h), a DONE by the worker's socket
 * (PFB_POOL_STATUS_SOCKET, Channel.fits and worker/ring_server.py), so that
 * a pool call takes as many inputs and outputs as an in-process one. */
static inline int pfb_pool_message_fits(uint64_t slots, uint32_t ring_slots) {
  return slots <= PFB_POOL_MAX_MESSAGE_SLOTS && (ring_slots == 0 || slots <= ring_slots);
}

/* The words one words message (RESULTS_BACK, FORGET, INPUTS_BACK) carries
 * at most on a ring of `ring_slots`: 64 slots, its header included, and never
 * more than the ring.  The one rule for the dispatcher's hand-backs
 * (dispatch_queue.c, post_words) and the worker's (ring_server.py,
 * inputs_back, through the pool module's words_per_message). */
static inline uint32_t pfb_pool_words_per_message(uint32_t ring_slots) {
  return PFB_POOL_WORDS_PER_SLOT * ((ring_slots > 64 ? 64 : ring_slots) - 1);
}

/* Whether the block a record names, at `offset` with `size` bytes in an
 * arena of `arena_bytes`, holds `nbytes` (UINT64_MAX: a size that
 * overflowed, never held): inside the mapping, aligned to PFB_POOL_ALIGN
 * (TensorFlow's PFB_TENSOR_ALIGNMENT divides it), big enough; a record of
 * no bytes and no block needs none.  The one check of another process's
 * word about a block, before this one reads it: pfb_reply_decode's
 * (reply_decode.c), for the kernel's results and the Python path's alike. */
static inline int pfb_pool_block_holds(uint64_t offset, uint64_t size, uint64_t nbytes,
                                       uint64_t arena_bytes) {
  if (nbytes == 0 && size == 0) return 1;
  return nbytes != UINT64_MAX && size >= nbytes && offset % PFB_POOL_ALIGN == 0 &&
         offset <= arena_bytes && size <= arena_bytes - offset;
}

/* Starts a message of `kind` (every other header field zero) in out[0]. */
void pfb_msg_init(PfbPoolSlot* out, uint16_t kind);

/* Appends a tensor record: `tensor` (its ndim, dtype, flags, offset and
 * size; its dims are ignored) with `dims` (ndim entries), and counts it.
 * 0; EINVAL for an ndim out of range; EMSGSIZE when the message would pass
 * `max_slots` (nothing appended). */
int pfb_msg_add_tensor(PfbPoolSlot* out, uint32_t max_slots, const PfbPoolTensor* tensor,
                       const int64_t* dims);

/* Appends a word (an offset or a token) and counts it; 0 or EMSGSIZE. */
int pfb_msg_add_word(PfbPoolSlot* out, uint32_t max_slots, uint64_t word);

/* Reads the tensor record at slot `*cursor` (start at 1) of `message`: its
 * record into `tensor` and its ndim dims into `dims` (room for
 * PFB_POOL_MAX_NDIM), and moves the cursor past it.  0, or EPROTO when the
 * record is malformed or runs past the message. */
int pfb_msg_read_tensor(const PfbPoolSlot* message, uint32_t* cursor, PfbPoolTensor* tensor,
                        int64_t* dims);

/* Word `index` of a words message; 0, or EPROTO when the message does not
 * hold it. */
int pfb_msg_read_word(const PfbPoolSlot* message, uint32_t index, uint64_t* word);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_RECORDS_H_ */
