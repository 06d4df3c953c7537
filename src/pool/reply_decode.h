/* The one decoder of a DONE (shm_layout.h, PFB_POOL_MSG_DONE) in the parent.
 * The kernel's native call (src/kernel/pool_route.cc, which compiles this
 * file into the kernel library) and the Python path (src/pool/reply.pxi,
 * Reply) take a reply's results only from it, so that each block's bounds,
 * alignment and size are checked in one place, and each result's share of
 * the statistics is counted by one rule.
 *
 * Plain C that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_REPLY_DECODE_H_
#define PYFUNC_BRIDGE_POOL_REPLY_DECODE_H_

#include <stdint.h>

#include "shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One result of a DONE, checked. */
typedef struct PfbReplyResult {
  PfbPoolTensor record;  /* as sent (its inline dims aside: see `dims`) */
  int64_t dims[PFB_POOL_MAX_NDIM];
  /* The bytes its block must hold: elements times the item size for
   * numbers (a PFB_POOL_TENSOR_SCALAR record's too), the record's size for
   * a pickled or strings one. */
  uint64_t nbytes;
  /* Statistics, the one rule for both paths: handed over from its block
   * (not copied out under copy=True), it saves the caller a copy, unless it
   * is empty or a NumPy scalar (a 0-d record the worker wrote itself, which
   * in-process is a value, not memory); `worker_copied`, the bytes the
   * worker copied into the block for such a result (not shared). */
  int saves_copy;
  uint64_t worker_copied;
} PfbReplyResult;

/* Checks the DONE `message` (its slots, as PfbDispatchCall.reply holds
 * them) against its worker's result arena of `arena_bytes` (0: none), and
 * describes its results into out[0 .. *decoded): status OK, its records;
 * status ERROR with a block, that block as one pickled result (the
 * exception); otherwise none.  Returns 0; EMSGSIZE when they pass `room`;
 * EPROTO for a malformed record; ERANGE for a block that is not aligned,
 * does not lie inside the arena or is smaller than `nbytes` (a numbers
 * record whose size overflows: nbytes UINT64_MAX).  On an error,
 * out[*decoded] is the result at fault, as far as it was read. */
int pfb_reply_decode(const PfbPoolSlot* message, uint64_t arena_bytes, PfbReplyResult* out,
                     uint32_t room, uint32_t* decoded);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_REPLY_DECODE_H_ */
