/* What the dispatcher's files share (dispatch.h is the public contract):
 * its structs, the lock order, and the helpers one file defines for the
 * others.  dispatch_reply.c: reply threads and the callers that read;
 * dispatch_life.c: lifetime and attach; dispatch_queue.c: the scheduler
 * queue and its posts; dispatch_submit.c: tokens, input blocks and submit;
 * dispatch_route.c: results and routes. */
#ifndef PYFUNC_BRIDGE_POOL_DISPATCH_INTERNAL_H_
#define PYFUNC_BRIDGE_POOL_DISPATCH_INTERNAL_H_

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "arena.h"
#include "dispatch.h"
#include "records.h"
#include "ring.h"

#define SC __ATOMIC_SEQ_CST

/* What a closed pool's calls end with (TensorFlow's FAILED_PRECONDITION, as
 * PoolClosedError's: pool/errors.py dispatch_error). */
#define FAILED_PRECONDITION 9
#define CLOSED_TEXT "pyfunc_bridge: the pool was closed"

/* A registered function.  References (`refs`, atomic): the registry's
 * (until forget or delete) and each submit that may LOAD it. */
typedef struct Token {
  uint32_t refs;
  uint64_t token;
  uint64_t size;
  struct Token* next;
  unsigned char payload[];  /* the LOAD payload, `size` bytes (one allocation) */
} Token;

/* A growable array of words (offsets, tokens). */
typedef struct Words {
  uint64_t* items;
  size_t count, capacity;
} Words;

/* (Small helpers every file uses: inline, as they were in one file.) */
static inline int words_push(Words* w, uint64_t value) {
  if (w->count == w->capacity) {
    size_t capacity = w->capacity ? 2 * w->capacity : 16;
    uint64_t* grown = (uint64_t*)realloc(w->items, capacity * sizeof(uint64_t));
    if (grown == NULL) return ENOMEM;
    w->items = grown;
    w->capacity = capacity;
  }
  w->items[w->count++] = value;
  return 0;
}

/* The index of `value` in `w`, or -1. */
static inline long words_find(const Words* w, uint64_t value) {
  for (size_t i = 0; i < w->count; ++i)
    if (w->items[i] == value) return (long)i;
  return -1;
}

static inline int words_remove(Words* w, uint64_t value) {
  long i = words_find(w, value);
  if (i >= 0) w->items[i] = w->items[--w->count];
  return i >= 0;
}

static inline void token_drop(Token* t) {
  if (__atomic_sub_fetch(&t->refs, 1, SC) == 0) free(t);
}

/* A call in the pool queue: its inputs in the input arena (the queue's
 * blocks, see dispatch.h) and its CALL built, waiting for a worker with
 * credit.  One allocation: this, its message, then `sizes` and `offsets`
 * (`count` each). */
typedef struct Queued {
  struct Queued* next;
  PfbDispatchCall* call;  /* the caller's, until finish takes it out */
  Token* fn;              /* a reference: the LOAD a worker may need */
  uint32_t count;
  uint64_t* sizes;        /* 0: no block */
  uint64_t* offsets;
  PfbPoolSlot message[];  /* the CALL (its stamp set when posted) */
} Queued;

typedef struct Worker {
  PfbDispatch* d;
  int index;
  /* Set under `post` from attach (its reply thread runs, `attached_count`
   * counts it) until lost (and read by submit's choice without it: a stale
   * read only picks another worker, rechecked under the lock). */
  int attached;
  uint64_t generation;
  PfbPoolControl* control; /* its segment (set at attach): what it runs now */
  /* Producer: whoever holds `post`.  Its doorbell, the worker's eventfd, is
   * a duplicate owned from attach to lost (-1 otherwise). */
  PfbRing requests;
  PfbRing replies;        /* consumer: whoever holds `role` */
  /* The reply ring's reader role (atomic): ROLE_FREE, ROLE_HELD (by the
   * reply thread or a waiting caller: the ring's one consumer now, reading
   * into `scratch`'s second half), ROLE_RETIRED (nobody reads: not attached yet, lost, or the
   * worker broke the protocol).  Only tried, never waited for, except by
   * lost(), which retires it. */
  uint32_t role;
  /* Its result arena, mapped by the dispatcher: one reference, from attach
   * until lost (which joins the reply thread first: on_done reads it). */
  PfbDispatchArena* arena;
  pthread_t thread;       /* its reply thread, while attached */
  /* The request ring's producer lock; guards `known` and `scratch`.  The
   * reply thread never takes it: a producer may sleep for room holding it,
   * and the room comes from a worker that may itself wait for the reply
   * thread to read. */
  pthread_mutex_t post;
  Words known;            /* tokens this worker has loaded */
  Words forget;           /* tokens to FORGET with its next request */
  /* Owned, made at the first attach: the message being built
   * (PFB_POOL_MAX_MESSAGE_SLOTS), then the role holder's message read. */
  PfbPoolSlot* scratch;
  /* Guards `pending` (the calls posted here that their callers still
   * wait for): taken by callers and the reply thread. */
  pthread_mutex_t calls;
  PfbDispatchCall* pending;
  uint64_t posted;        /* CALLs posted to this attachment (guarded by `post`) */
  /* CALLs posted to this attachment whose DONE has not come, abandoned
   * ones too (its credits used): atomic; raised by a holder of `post` as
   * it posts, lowered under the dispatcher's `queue_lock` (a DONE, a post
   * that failed, lost). */
  uint32_t outstanding;
  /* Atomic: a post of the queue was asked for while another thread held
   * `post`; whoever unlocks it runs it (pfb_disp_post_unlock). */
  int wanted;
  /* Guards `back`: result blocks to hand back with the next message. */
  pthread_mutex_t back_lock;
  Words back;
  /* Input blocks in this worker's hands (guarded by the dispatcher's arena
   * lock): freed when it hands them back, or when it is lost. */
  Words inputs;
} Worker;

/* Lock order: a worker's `post`, then the dispatcher's `queue_lock`, then a
 * worker's `calls`; `post`, then `arena_lock` (a call's input blocks handed
 * to that worker, or freed) or that worker's `back_lock`.  `queue_lock` and
 * `arena_lock` are never held together; `tokens_lock` is taken alone. */
struct PfbDispatch {
  char* input_base;
  uint64_t input_bytes;
  /* The input arena's allocator and its waiters for room. */
  pthread_mutex_t arena_lock;
  pthread_cond_t room;
  PfbArena* arena;
  pthread_mutex_t tokens_lock;
  Token* tokens;
  int workers_count;
  /* The pool queue (FIFO) and the number of attached workers; a worker's
   * `outstanding` and a queued call's `worker` change under it too.  Taken
   * after a worker's `post`, before its `calls`; never with `arena_lock`. */
  pthread_mutex_t queue_lock;
  Queued* queue_head;
  Queued** queue_tail;  /* where a push at the back goes: the last `next`, or &queue_head */
  int attached_count;
  uint32_t ring_slots;  /* atomic: slots per request ring (set by attach) */
  int closed;        /* atomic */
  uint32_t room_waiters;  /* atomic: submits waiting for room (see pfb_disp_alloc_blocks) */
  uint32_t active;   /* atomic: submits under way (delete waits for them) */
  uint32_t refs;     /* atomic: see dispatch.h, Lifetime */
  PfbDispatchCounts counts;  /* atomic fields */
  Worker workers[];  /* workers_count of them, in the dispatcher's allocation */
};

enum { ROLE_FREE = 0, ROLE_HELD = 1, ROLE_RETIRED = 2 };

static inline void bump(uint64_t* field, int64_t delta) { __atomic_add_fetch(field, delta, SC); }

/* Defined in one file, used by others (each commented where it is
 * defined). */

/* dispatch_reply.c */
void pfb_disp_end_call(PfbDispatchCall* call, int resend, int32_t code, const char* message,
                       const PfbDispatchCall* own);
PfbDispatchCall* pfb_disp_unlist(Worker* w, const PfbDispatchCall* call, uint64_t id);
void* pfb_disp_reply_thread(void* arg);

/* dispatch_queue.c */
int pfb_disp_queue_waits(Worker* w);
Worker* pfb_disp_choose(PfbDispatch* d);
void pfb_disp_queue_push(PfbDispatch* d, Queued* q, int front);
Queued* pfb_disp_queue_remove(PfbDispatch* d, PfbDispatchCall* call);
Queued* pfb_disp_queue_take(PfbDispatch* d);
void pfb_disp_queued_free(PfbDispatch* d, Queued* q, int release);
void pfb_disp_end_queued(PfbDispatch* d, Queued* list);
int pfb_disp_pump(PfbDispatch* d, Worker* w, int64_t deadline, PfbDispatchCall* own,
                  int* own_rc);
void pfb_disp_pump_async(Worker* w);
void pfb_disp_post_unlock(Worker* w);

/* dispatch_submit.c */
void pfb_disp_free_blocks(PfbDispatch* d, Words* held, const uint64_t* sizes,
                          const uint64_t* offsets, size_t n);
int pfb_disp_alloc_blocks(PfbDispatch* d, const uint64_t* sizes, uint32_t count,
                          uint64_t* offsets, int64_t deadline);

#endif  /* PYFUNC_BRIDGE_POOL_DISPATCH_INTERNAL_H_ */
