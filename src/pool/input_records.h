/* A call's input records (PfbDispatchInput, dispatch.h) and how they
 * travel: the one rule for the kernel's native calls (MakeInputs,
 * src/kernel/pool_route.cc, which compiles this file into the kernel
 * library) and the Python path (_ring_input, src/pool/route.pxi), which
 * only find their values' data, dtype and shape.
 *
 * Plain C that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_INPUT_RECORDS_H_
#define PYFUNC_BRIDGE_POOL_INPUT_RECORDS_H_

#include <stdint.h>

#include "dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A call's inputs as the statistics count them (PfbDispatchRouteCounts):
 * `bytes`, the pool's (numbers' bytes, strings' without their length
 * prefixes); the function's, by reason: `string_bytes` converted,
 * `to_worker` numbers copied to the worker (not a 0-d input under
 * PFB_POOL_CALL_SCALARS, which in-process is a value, not memory). */
typedef struct PfbInputCounts {
  uint64_t bytes, string_bytes, to_worker;
} PfbInputCounts;

/* One element of a strings input. */
typedef struct PfbBytes {
  const char* data;
  uint64_t size;
} PfbBytes;

/* Describes a numbers input (compact row-major, `nbytes` at `data`, of
 * DLPack dtype code/bits/lanes and ndim `dims`, which the record points
 * to) of a call of CALL flags `call_flags` into `item`, and counts it. */
void pfb_input_numbers(PfbDispatchInput* item, const void* data, uint64_t nbytes, uint8_t code,
                       uint8_t bits, uint16_t lanes, int32_t ndim, const int64_t* dims,
                       uint32_t call_flags, PfbInputCounts* counts);

/* Describes a strings input of `count` elements (row-major) into `item`
 * and counts it: its block, encoded as shm_layout.h says (a uint64
 * little-endian length before each element's bytes), is malloc'd and
 * returned, the caller's to free once the call was submitted (the record
 * points to it); NULL without memory (nothing described). */
char* pfb_input_strings(PfbDispatchInput* item, const PfbBytes* elements, uint64_t count,
                        int32_t ndim, const int64_t* dims, PfbInputCounts* counts);

/* How a call goes, decided before its first submit (rc 0) and after each
 * submit declined for room (rc ENOSPC: none free now; E2BIG: never):
 * DECLINED, nothing else can carry it; AS_IS, its records as they are;
 * PACKED, more records than a message holds (`fits` 0, from
 * pfb_dispatch_fits), so one pulled payload of the whole argument list
 * (PFB_POOL_CALL_PACKED); MOVED, some inputs are pulled over the socket:
 * their records became PFB_POOL_TENSOR_SOCKET ones of payload id 0, for the
 * caller to fill. */
enum { PFB_SEND_DECLINED = 0, PFB_SEND_AS_IS, PFB_SEND_PACKED, PFB_SEND_MOVED };

/* The transport of the call of `count` records `inputs`, by the submit's
 * `rc`, `fits`, the input arena's free bytes `room` (pfb_dispatch_free_bytes)
 * and `moves`, the times inputs were moved already.  Its largest blocks go by
 * the socket until the rest fit the room free now (ENOSPC, first move);
 * otherwise, or where they fit in bytes but not in the arena's pieces, all of
 * them.  Only a caller that can pickle (Python) carries out PACKED or
 * MOVED; the kernel declines instead. */
int pfb_input_transport(PfbDispatchInput* inputs, uint32_t count, int rc, int fits,
                        uint64_t room, int moves);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_INPUT_RECORDS_H_ */
