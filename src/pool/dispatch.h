/* The parent's native side of a pool's rings (shm_layout.h): calls posted
 * and completed without Python.  A caller hands its inputs (host memory) and
 * a function token; the dispatcher copies the inputs into the input arena,
 * posts a CALL to a worker (a LOAD first, the first time that worker meets
 * the token), and the worker's reply thread completes the call when its
 * DONE arrives.  Nothing here takes the GIL or calls Python: the kernel can
 * call it from TF's threads while any Python thread holds the GIL.
 *
 * What stays with Python (pyfunc_bridge/_process.py): starting workers and
 * laying out their segments (it attaches each to the dispatcher), noticing a
 * worker's death (its socket ends: pfb_dispatch_lost fails that worker's
 * calls with the message Python built), and decoding what is not plain
 * memory (errors, pickled values).
 *
 * Threads: any number of callers; one reply thread per attached worker (a
 * pthread, started by pfb_dispatch_attach, ended by pfb_dispatch_lost or
 * pfb_dispatch_delete).  Each worker's request ring has one producer at a
 * time (the worker's `post` mutex); the input arena's allocator has its own
 * mutex and a condition for callers waiting for room.
 *
 * Plain C (pthreads, futexes) that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_DISPATCH_H_
#define PYFUNC_BRIDGE_POOL_DISPATCH_H_

#include <stdint.h>

#include "shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PfbDispatch PfbDispatch;

/* One input: host memory, compact row-major (or a strings block already
 * encoded as shm_layout.h says, with PFB_POOL_TENSOR_STRINGS). */
typedef struct PfbDispatchInput {
  const void* data;
  uint64_t nbytes;
  uint8_t code, bits;
  uint16_t lanes;
  uint32_t flags;  /* PFB_POOL_TENSOR_* */
  int32_t ndim;
  const int64_t* dims;
} PfbDispatchInput;

/* The call's states (PfbDispatchCall.state, a futex word). */
enum {
  PFB_DISPATCH_WAITING = 0,
  PFB_DISPATCH_DONE = 1,    /* `reply` holds the worker's DONE */
  PFB_DISPATCH_FAILED = 2   /* the worker died or the pool closed: `error` */
};

/* One call, in its caller's memory, from pfb_dispatch_submit until
 * pfb_dispatch_finish (which the caller must call once the call was
 * submitted, whether it waited or not).  Whoever comes second disposes of
 * the results: finish takes a call that is not done off its worker's list,
 * and the reply thread, finding no call for the DONE, hands its result
 * blocks back at once; the input blocks stay the worker's until its
 * INPUTS_BACK, whatever the caller does. */
typedef struct PfbDispatchCall {
  uint32_t state;        /* PFB_DISPATCH_*, written by the reply thread */
  uint64_t id;
  int worker;            /* the worker that has it */
  uint64_t generation;   /* that worker's generation (RESULTS_BACK names it) */
  /* DONE: the message (header, records), malloc'd by the reply thread,
   * freed by pfb_dispatch_finish. */
  PfbPoolSlot* reply;
  uint32_t reply_slots;
  /* FAILED: the message, malloc'd, freed by pfb_dispatch_finish. */
  char* error;
  int32_t error_code;    /* a TensorFlow error code */
  struct PfbDispatchCall* next;  /* the worker's list of calls in flight */
} PfbDispatchCall;

/* A dispatcher over an input arena mapped at `input_base` (this process's
 * address), for `workers` worker slots.  NULL when out of memory. */
PfbDispatch* pfb_dispatch_new(char* input_base, uint64_t input_bytes, int workers);
/* Ends every reply thread, fails the calls in flight ("the pool was
 * closed"), and frees the dispatcher once no call or result refers to it. */
void pfb_dispatch_delete(PfbDispatch* d);

/* Worker slot `index` is served by a worker with this control segment and
 * doorbell (an eventfd the caller keeps open until the worker is lost) and
 * this result arena (mapped at `result_base`): starts its reply thread.  0,
 * or an errno. */
int pfb_dispatch_attach(PfbDispatch* d, int index, PfbPoolControl* control, int doorbell,
                        const char* result_base, uint64_t result_bytes, uint64_t generation);
/* The worker of slot `index` ended: its calls in flight fail with
 * (`code`, `message`), its input blocks are free again (it holds nothing
 * now), its reply thread ends.  The caller closes the rings first. */
void pfb_dispatch_lost(PfbDispatch* d, int index, int32_t code, const char* message);

/* The function of `token`: the LOAD payload (shm_layout.h: the pickle of
 * (sys.path or None, the function's cloudpickle)), copied.  0, or ENOMEM. */
int pfb_dispatch_register(PfbDispatch* d, uint64_t token, const void* payload, uint64_t size);
/* Whether `token` is registered. */
int pfb_dispatch_knows(PfbDispatch* d, uint64_t token);

/* Copies the inputs into the input arena (waiting up to `timeout_ns` for
 * room), picks the worker with the fewest calls in flight, posts a LOAD if
 * it lacks the token and the CALL, and rings its doorbell if it sleeps.
 * 0; EAGAIN: no worker attached; ENOENT: token not registered; ETIMEDOUT;
 * E2BIG: the inputs can never fit the arena; EPIPE: closed. */
int pfb_dispatch_submit(PfbDispatch* d, uint64_t token, uint32_t flags,
                        const PfbDispatchInput* inputs, uint32_t count, int64_t timeout_ns,
                        PfbDispatchCall* call);
/* Sleeps until the call is DONE or FAILED (0), or `timeout_ns` passed
 * (ETIMEDOUT; negative: no limit). */
int pfb_dispatch_wait(PfbDispatchCall* call, int64_t timeout_ns);
/* The caller is done with the call: frees its reply and error; a call not
 * completed yet is abandoned (its reply thread hands its results back). */
void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call);

/* The result arena of worker slot `index` at `generation`, in this process
 * (NULL when that worker is gone and its arena unmapped by Python). */
const char* pfb_dispatch_results(PfbDispatch* d, int index, uint64_t generation,
                                 uint64_t* bytes);
/* A result block of worker `index` (at `generation`) is no longer held:
 * handed back with that worker's next message (dropped when the worker is
 * gone: its arena dies with it).  Any thread. */
void pfb_dispatch_result_back(PfbDispatch* d, int index, uint64_t generation, uint64_t offset);

/* The input arena's allocator, for the pool's Python path, which shares
 * the arena: a block of at least `nbytes` now (0, its offset and size) or
 * ENOMEM; and its free (0, or EINVAL for no live block there), which wakes
 * the native callers waiting for room. */
int pfb_dispatch_alloc(PfbDispatch* d, uint64_t nbytes, uint64_t* offset, uint64_t* size);
int pfb_dispatch_free(PfbDispatch* d, uint64_t offset);
uint64_t pfb_dispatch_free_bytes(PfbDispatch* d);

/* Counters, for tests and statistics. */
typedef struct PfbDispatchCounts {
  uint64_t calls;        /* submitted */
  uint64_t loads;        /* LOADs posted */
  uint64_t doorbells;    /* doorbell rings (wake-ups of workers) */
  uint64_t reply_sleeps; /* reply threads' futex sleeps */
  uint64_t input_blocks; /* input blocks live now */
} PfbDispatchCounts;
void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_DISPATCH_H_ */
