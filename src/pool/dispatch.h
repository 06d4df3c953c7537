/* The parent's native side of a pool's rings (shm_layout.h): calls copied
 * in, queued, posted and completed without Python or the GIL, so that
 * kernels call it from TF's threads while any Python thread holds the GIL.
 * Python (pyfunc_bridge/pool/) attaches workers, reports their deaths
 * (lost) and decodes what is not plain memory.  The steps, the threads
 * (reply threads, reader roles), the scheduler and who owns each block:
 * docs/pool.md; lock order and what each lock guards: dispatch_internal.h.
 *
 * Lifetime: a dispatcher is referenced by its creator (Python's Dispatcher,
 * whose pfb_dispatch_delete closes it), by each route and by each result
 * arena mapping; its memory goes with the last reference, so a kernel that
 * outlives its pool finds it closed (EPIPE), never freed.
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

/* A worker's result arena as the dispatcher maps it: a second mapping of the
 * pool's pages (mremap of Python's MAP_SHARED mapping), made when the worker
 * is attached, so that memory viewed by a kernel's output tensor outlives
 * the worker, Python's mapping and the pool.  References (`refs`, atomic):
 * the worker's attachment (until it is lost), each DONE not yet finished
 * (PfbDispatchCall.arena), and each result block a caller keeps
 * (pfb_dispatch_arena_keep); unmapped with the last one.  Callers read
 * `base` and `bytes` only. */
typedef struct PfbDispatchArena {
  uint32_t refs;
  PfbDispatch* d;        /* a reference on the dispatcher */
  int index;             /* the worker slot whose arena this is */
  char* base;            /* the mapping, owned (PROT_READ) */
  uint64_t bytes;
} PfbDispatchArena;

/* One input: host memory, compact row-major (or a strings block already
 * encoded as shm_layout.h says, with PFB_POOL_TENSOR_STRINGS); or, with
 * PFB_POOL_TENSOR_SOCKET, none: no block is allocated, `data` is NULL and
 * `nbytes` is the payload id the record's `offset` carries (ndim 0). */
typedef struct PfbDispatchInput {
  const void* data;
  uint64_t nbytes;  /* the data's bytes; PFB_POOL_TENSOR_SOCKET: the payload id */
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
  PFB_DISPATCH_FAILED = 2,  /* the worker died or the pool closed: `error` */
  /* The worker died before it started the call (its function never ran):
   * pfb_dispatch_call submits it again. */
  PFB_DISPATCH_RESEND = 3
};

/* One call, in its caller's memory, from pfb_dispatch_call until
 * pfb_dispatch_finish (which the caller calls once it is done with it,
 * submitted or not, waited for or not).  It is queued first (`worker` -1),
 * then posted to a worker; the caller sees neither step, only `state`.
 * Who owns its input blocks: the dispatcher (the queue) while it is
 * queued, freed by whoever takes it out without posting it (finish of an
 * abandoned call, a closed dispatcher, the last worker lost); the worker
 * once posted, until its INPUTS_BACK, whatever the caller does.  Whoever
 * comes second disposes of the results: finish takes a call that is not
 * done off its worker's list, and the reply thread, finding no call for
 * the DONE, hands its result blocks back at once. */
typedef struct PfbDispatchCall {
  uint32_t state;        /* PFB_DISPATCH_*, written by whoever completes it */
  PfbDispatch* d;        /* its dispatcher (its waiting caller reads its worker's ring) */
  uint64_t id;
  int worker;            /* the worker that has it; -1 while queued (the
                          * queue's mutex; atomic: the waiting caller reads it) */
  uint64_t generation;   /* that worker's generation (a waiting caller reads its
                          * reply ring only while the attachment is the same) */
  uint64_t sequence;     /* its place among the CALLs posted to that worker */
  /* DONE: the message (header, records), malloc'd by its reader,
   * freed by pfb_dispatch_finish; and a reference on the arena its result
   * blocks are in, dropped by pfb_dispatch_finish.  The blocks themselves
   * are the caller's: each goes back by pfb_dispatch_arena_hand_back. */
  PfbPoolSlot* reply;
  PfbDispatchArena* arena;
  /* FAILED: the message, malloc'd, freed by pfb_dispatch_finish. */
  char* error;
  int32_t error_code;    /* a TensorFlow error code */
  /* A posted call's (pfb_dispatch_post): whoever completes it calls
   * on_end(call, on_end_arg) once, after publishing `state`, instead of
   * waking a sleeper.  It runs on a reply thread holding the reader role,
   * in lost(), or with a worker's `post` held: it must not block, take the
   * GIL or call into the dispatcher (it hands the call to a thread of its
   * own, src/kernel/pool_route.cc). */
  void (*on_end)(struct PfbDispatchCall* call, void* arg);
  void* on_end_arg;
  struct PfbDispatchCall* next;  /* the worker's list of calls in flight (its
                                  * `calls` mutex) */
} PfbDispatchCall;

/* A dispatcher over an input arena mapped at `input_base` (this process's
 * address, a MAP_SHARED mapping: the dispatcher maps its pages again, until
 * it is closed), for `workers` worker slots.  NULL when out of memory or
 * the mapping cannot be made. */
PfbDispatch* pfb_dispatch_new(char* input_base, uint64_t input_bytes, int workers);
/* Refuses calls and attaches from now on, fails the queued calls and those
 * in flight ("the pool was closed", FAILED_PRECONDITION), ends every reply
 * thread, waits for the submits under way, unmaps the input arena, drops
 * the functions and the creator's reference. */
void pfb_dispatch_delete(PfbDispatch* d);
void pfb_dispatch_retain(PfbDispatch* d);
void pfb_dispatch_release(PfbDispatch* d);
/* In a forked child: the dispatcher is its parent's (the rings, the
 * workers), and its reply threads are not in this process.  Refuses every
 * call from now on (EPIPE) without touching the rings or joining threads,
 * and closes this process's copies of the doorbells; its memory is never
 * freed (its mappings the op layer makes private, pyfunc_bridge/pool/fork.py). */
void pfb_dispatch_disown(PfbDispatch* d);

/* Worker slot `index` is served by a worker with this control segment
 * (which the caller keeps mapped until the slot is attached again or the
 * dispatcher deleted: a submit may read it a moment after lost()), this
 * doorbell (an eventfd: the dispatcher rings a duplicate of its own, closed
 * by lost()) and this result arena (mapped at `result_base`; the
 * dispatcher maps it again): starts its reply thread.  0, or an errno. */
int pfb_dispatch_attach(PfbDispatch* d, int index, PfbPoolControl* control, int doorbell,
                        const char* result_base, uint64_t result_bytes, uint64_t generation);
/* The worker of slot `index` ended: its calls in flight fail with
 * (`code`, `message`), its input blocks are free again (it holds nothing
 * now), its reply thread ends.  The caller closes the rings first.  With
 * `resend` (a worker that died, not a pool that closes), the calls it had
 * not started (shm_layout.h, ring_calls_started) end RESEND instead.  The
 * queue waits for the other workers, or for a worker attached later; with
 * the last attached worker lost, its calls end RESEND (the caller submits
 * again: EAGAIN, and the pool waits for a worker). */
void pfb_dispatch_lost(PfbDispatch* d, int index, int32_t code, const char* message,
                       int resend);

/* The function of `token`: the LOAD payload (shm_layout.h: the pickle of
 * (sys.path or None, the function's cloudpickle)), copied.  0, or ENOMEM. */
int pfb_dispatch_register(PfbDispatch* d, uint64_t token, const void* payload, uint64_t size);
/* The function of `token` was dropped: unregistered (calls of it: ENOENT),
 * and each worker that loaded it over the ring gets a FORGET with its next
 * request. */
void pfb_dispatch_forget(PfbDispatch* d, uint64_t token);

/* Runs a call: copies the inputs into the input arena (waiting up to
 * `room_ns` for room), queues it, posts the queue's first calls to the
 * workers with credit (the rest the reply threads post), then sleeps until
 * it is DONE or FAILED, for up to `wait_ns` (negative: no limit; reading
 * its worker's reply ring itself while it holds the reader role).  A call
 * whose worker died before starting it (RESEND) is submitted again.  `call`
 * is zeroed before the first call; while it comes back ETIMEDOUT with
 * `call->id` set (submitted), call again to wait on.  0: DONE or FAILED.
 * Not submitted (`id` 0): EAGAIN, no worker attached; ENOENT, token not
 * registered; ETIMEDOUT; ENOSPC, no room, and no posted call in flight to
 * make any (queued calls and functions hold their blocks), or no room for
 * the LOAD; E2BIG, the inputs can never fit the arena or the ring; EINVAL,
 * a bad ndim; EPIPE, closed. */
int pfb_dispatch_call(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      int64_t wait_ns, PfbDispatchCall* call);
/* Submits a call as pfb_dispatch_call does (`room_ns` for room), without
 * waiting for it: 0, and on_end(call, arg) comes once the call is DONE,
 * FAILED or RESEND (maybe before this returns; on any thread, see
 * PfbDispatchCall.on_end); the caller then finishes it, and a RESEND it
 * posts again.  Not submitted: the errnos of pfb_dispatch_call, and no
 * on_end. */
int pfb_dispatch_post(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      PfbDispatchCall* call, void (*on_end)(PfbDispatchCall*, void*),
                      void* arg);
/* Waits up to `wait_ns` for a posted call to end, as pfb_dispatch_call
 * waits (reading its worker's ring itself while it holds the reader role;
 * on_end comes all the same, on this thread when it read the DONE): 0, or
 * ETIMEDOUT. */
int pfb_dispatch_wait(PfbDispatchCall* call, int64_t wait_ns);
/* Abandons a posted call that is not completed yet, without waiting: 1,
 * it was taken out (a queued one's blocks freed, a posted one's results go
 * back when they come) and no on_end will come; 0, it was completed or is
 * being completed (on_end comes, or came), or it was never submitted. */
int pfb_dispatch_abandon(PfbDispatch* d, PfbDispatchCall* call);
/* The caller is done with the call: frees its reply and error; a call not
 * completed yet is abandoned: a queued one leaves the queue and its input
 * blocks are freed now; a posted one's results go back when they come. */
void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call);

/* Result arenas (PfbDispatchArena): a reference more (for a block the
 * caller keeps), one less, and a block handed back to its worker (with that
 * worker's next request; nothing when the worker is gone: its arena dies
 * with it).  Any thread, no GIL. */
void pfb_dispatch_arena_keep(PfbDispatchArena* arena);
void pfb_dispatch_arena_drop(PfbDispatchArena* arena);
void pfb_dispatch_arena_hand_back(PfbDispatchArena* arena, uint64_t offset);
/* Hands back every result block of a DONE its caller does not take (its
 * records', or its error's). */
void pfb_dispatch_reply_hand_back(PfbDispatchCall* call);

/* The input arena's free bytes now. */
uint64_t pfb_dispatch_free_bytes(PfbDispatch* d);

/* Whether a CALL of these inputs fits the workers' request rings (before a
 * worker was attached: a message), by pfb_pool_message_fits (records.h).
 * pfb_dispatch_call declines one that does not (E2BIG); it travels packed
 * (PFB_POOL_CALL_PACKED, input_records.h). */
int pfb_dispatch_fits(PfbDispatch* d, const PfbDispatchInput* inputs, uint32_t count);

/* Counters, for tests and statistics. */
typedef struct PfbDispatchCounts {
  uint64_t calls;        /* submitted */
  uint64_t loads;        /* LOADs posted */
  uint64_t reply_sleeps; /* reply threads' futex sleeps */
  uint64_t caller_reads; /* waits that read their worker's reply ring themselves */
  uint64_t input_blocks; /* input blocks live now */
  uint64_t queued;       /* calls in the pool queue now */
} PfbDispatchCounts;
void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out);

/* ------------------------------------------------------------ routes -- */

/* What a kernel's native calls add up (atomic, relaxed): the pool's and the
 * function's statistics read them (pfb.stats()).  Calls that fall back to
 * Python are counted there instead. */
typedef struct PfbDispatchRouteCounts {
  uint64_t calls;        /* answered by a worker (returned or raised) */
  uint64_t replied;      /* of those, handed to Python with their reply (the
                          * conversion layer counts them for the function) */
  uint64_t errors;       /* failed natively: the worker died or the pool
                          * closed (the function's calls and errors, not
                          * the pool's calls, which its workers answered) */
  uint64_t failed;       /* failed by either path (the pool's calls_failed):
                          * pfb_route_count_failed */
  uint64_t bytes_in;     /* answered calls' inputs' data (strings' bytes) */
  uint64_t bytes_out;    /* results' data */
  uint64_t shared_out;   /* results' bytes handed to TF without a copy */
  uint64_t copied_out;   /* results' bytes copied (copy=True) */
  uint64_t copies_saved; /* results handed over from a result block without a
                          * copy here (not copy=True), shared or copied by the
                          * worker; not a NumPy scalar (the Python path
                          * pickles it) */
  uint64_t queued_ns;    /* posted -> its worker started it */
  uint64_t worker_ns;    /* its worker started -> finished it */
  uint64_t total_ns;     /* the kernel's whole call */
  uint64_t worker_copied; /* results' bytes the worker copied into its arena
                           * (NumPy scalars aside): the function's "worker" copies */
  /* Of bytes_in, as the function's statistics count them (the Python
   * path's rule): strings' bytes (its "string" copies), and numbers copied
   * for the worker (its "worker" copies; not a 0-d input that the function
   * takes as a NumPy scalar). */
  uint64_t strings_in;
  uint64_t worker_in;
} PfbDispatchRouteCounts;

struct PfbDispatchApi;

/* A kernel's way to one function of one pool without Python: made by the
 * pool (Python) when a kernel's call first ran there, handed to the kernel
 * through PfbCall.route (bridge_abi.h), and shared by the kernel's calls.
 * References (`refs`, atomic): the kernel's and Python's (its statistics);
 * the last one releases the dispatcher and frees the route (api->route_drop,
 * or pfb_dispatch_route_drop).  Every other field is fixed once made. */
typedef struct PfbDispatchRoute {
  uint32_t refs;
  const struct PfbDispatchApi* api;
  PfbDispatch* d;         /* a reference */
  uint64_t token;         /* the function, registered with d */
  uint32_t flags;         /* its CALLs' PFB_POOL_CALL_* */
  const int* counting;    /* nonzero: statistics are on (pfb_dispatch_set_counting) */
  PfbDispatchRouteCounts counts;
} PfbDispatchRoute;

/* A route with one reference (the caller's), or NULL (no memory). */
PfbDispatchRoute* pfb_dispatch_route_new(PfbDispatch* d, uint64_t token, uint32_t flags);
void pfb_dispatch_route_keep(PfbDispatchRoute* route);
void pfb_dispatch_route_drop(PfbDispatchRoute* route);
/* Whether routes count (pfb.enable_stats): one switch for the process. */
void pfb_dispatch_set_counting(int on);
int pfb_dispatch_counting(void);

/* The functions a kernel calls, for a library that does not link the pool
 * module (the kernel library): every route points to one static table. */
typedef struct PfbDispatchApi {
  int (*call)(PfbDispatch* d, uint64_t token, uint32_t flags, const PfbDispatchInput* inputs,
              uint32_t count, int64_t room_ns, int64_t wait_ns, PfbDispatchCall* call);
  void (*finish)(PfbDispatch* d, PfbDispatchCall* call);
  void (*arena_keep)(PfbDispatchArena* arena);
  void (*arena_drop)(PfbDispatchArena* arena);
  void (*arena_hand_back)(PfbDispatchArena* arena, uint64_t offset);
  void (*route_keep)(PfbDispatchRoute* route);
  void (*route_drop)(PfbDispatchRoute* route);
  void (*reply_hand_back)(PfbDispatchCall* call);
  int (*post)(PfbDispatch* d, uint64_t token, uint32_t flags, const PfbDispatchInput* inputs,
              uint32_t count, int64_t room_ns, PfbDispatchCall* call,
              void (*on_end)(PfbDispatchCall*, void*), void* arg);
  int (*abandon)(PfbDispatch* d, PfbDispatchCall* call);
  int (*wait)(PfbDispatchCall* call, int64_t wait_ns);
} PfbDispatchApi;

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_DISPATCH_H_ */
