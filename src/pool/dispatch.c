/* The parent's native side of the rings (dispatch.h). */
#define _GNU_SOURCE /* mremap, MREMAP_MAYMOVE */
#include "dispatch.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "futex.h"
#include "records.h"
#include "ring.h"

#define SC __ATOMIC_SEQ_CST

/* What a closed pool's calls end with (TensorFlow's FAILED_PRECONDITION, as
 * PoolClosedError's: pool/errors.py dispatch_error). */
#define FAILED_PRECONDITION 9
#define CLOSED_TEXT "pyfunc_bridge: the pool was closed"

/* A registered function.  References (`refs`, atomic): the registry's
 * (until forget or destroy) and each submit that may LOAD it. */
typedef struct Token {
  uint32_t refs;
  uint64_t token;
  void* payload;  /* the LOAD payload, owned */
  uint64_t size;
  struct Token* next;
} Token;

/* A growable array of words (offsets, tokens). */
typedef struct Words {
  uint64_t* items;
  size_t count, capacity;
} Words;

static int words_push(Words* w, uint64_t value) {
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
static long words_find(const Words* w, uint64_t value) {
  for (size_t i = 0; i < w->count; ++i)
    if (w->items[i] == value) return (long)i;
  return -1;
}

static int words_remove(Words* w, uint64_t value) {
  long i = words_find(w, value);
  if (i >= 0) w->items[i] = w->items[--w->count];
  return i >= 0;
}

static void token_drop(Token* t) {
  if (__atomic_sub_fetch(&t->refs, 1, SC) == 0) {
    free(t->payload);
    free(t);
  }
}

/* Calls posted to one worker and not yet answered (its credits): one that
 * runs and the next one ready on its ring, so that a worker never waits
 * for the parent between calls, and a worker stuck in a slow call holds
 * one call more at most (the rest wait in the pool queue). */
#define CREDITS 2

/* A reply thread whose worker has credit while calls wait (a post that
 * found no room: the ring, the arena for a LOAD) looks again this often;
 * otherwise it sleeps until a message comes. */
#define RETRY_NS 1000000

/* A call in the pool queue: its inputs in the input arena (the queue's
 * blocks, see dispatch.h) and its CALL built, waiting for a worker with
 * credit.  One allocation: this, then `sizes` and `offsets` (`count`
 * each), then the message. */
typedef struct Queued {
  struct Queued* next;
  PfbDispatchCall* call;  /* the caller's, until finish takes it out */
  Token* fn;              /* a reference: the LOAD a worker may need */
  uint32_t count;
  uint64_t* sizes;        /* 0: no block */
  uint64_t* offsets;
  PfbPoolSlot* message;   /* the CALL (its stamp set when posted) */
} Queued;

typedef struct Worker {
  PfbDispatch* d;
  int index;
  /* Set under `post` (and read by submit's choice without it: a stale
   * read only picks another worker, rechecked under the lock). */
  int attached;
  uint64_t generation;
  PfbPoolControl* control; /* its segment (set at attach): what it runs now */
  int doorbell;           /* its eventfd, a duplicate owned from attach to lost */
  PfbRing requests;       /* producer: whoever holds `post` */
  PfbRing replies;        /* consumer: whoever holds `role` */
  /* The reply ring's reader role (atomic): ROLE_FREE, ROLE_HELD (by the
   * reply thread or a waiting caller: the ring's one consumer now, using
   * `reading`), ROLE_RETIRED (nobody reads: not attached yet, lost, or the
   * worker broke the protocol).  Only tried, never waited for, except by
   * lost(), which retires it. */
  uint32_t role;
  PfbPoolSlot* reading;   /* the role holder's message buffer (PFB_POOL_MAX_MESSAGE_SLOTS) */
  /* Its result arena, mapped by the dispatcher: one reference, from attach
   * until lost (which joins the reply thread first: on_done reads it). */
  PfbDispatchArena* arena;
  pthread_t thread;
  int has_thread;
  /* The request ring's producer lock; guards `known` and `scratch`.  The
   * reply thread never takes it: a producer may sleep for room holding it,
   * and the room comes from a worker that may itself wait for the reply
   * thread to read. */
  pthread_mutex_t post;
  Words known;            /* tokens this worker has loaded */
  Words forget;           /* tokens to FORGET with its next request */
  PfbPoolSlot* scratch;   /* the message being built (PFB_POOL_MAX_MESSAGE_SLOTS) */
  /* Guards `pending` (the calls posted here that their callers still
   * wait for): taken by callers and the reply thread. */
  pthread_mutex_t calls;
  PfbDispatchCall* pending;
  uint64_t posted;        /* CALLs posted to this attachment (guarded by `post`) */
  /* CALLs posted to this attachment whose DONE has not come, abandoned
   * ones too (its credits used): atomic; raised by a holder of `post` as
   * it posts, lowered under the dispatcher's `queue_lock` (a DONE, a post
   * that failed, lost).  `counted`: whether `attached_count` counts it
   * (queue_lock). */
  uint32_t outstanding;
  int counted;
  /* Atomic: a post of the queue was asked for while another thread held
   * `post`; whoever unlocks it runs it (post_unlock). */
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
  Worker* workers;
  /* The pool queue (FIFO) and the number of attached workers; a worker's
   * `outstanding` and a queued call's `worker` change under it too.  Taken
   * after a worker's `post`, before its `calls`; never with `arena_lock`. */
  pthread_mutex_t queue_lock;
  Queued* queue_head;
  Queued* queue_tail;
  int attached_count;
  uint32_t ring_slots;  /* atomic: slots per request ring (set by attach) */
  int closed;        /* atomic */
  uint32_t room_waiters;  /* atomic: submits waiting for room (see alloc_blocks) */
  uint32_t active;   /* atomic: submits under way (delete waits for them) */
  uint32_t refs;     /* atomic: see dispatch.h, Lifetime */
  PfbDispatchCounts counts;  /* atomic fields */
};

static void pump_async(Worker* w);
static void post_unlock(Worker* w);
static int queue_waits(Worker* w);
static Queued* queue_take(PfbDispatch* d);
static void end_queued(PfbDispatch* d, Queued* list);

/* ------------------------------------------------------------- helpers -- */

static void bump(uint64_t* field, int64_t delta) { __atomic_add_fetch(field, delta, SC); }

static int counting_on = 1;  /* pfb_dispatch_set_counting */
static uint64_t next_call_id;  /* atomic: every dispatcher's calls */

/* Publishes the call's end and wakes its caller (in this process: a
 * private futex), unless that caller is the reader itself (`own`).  (A
 * caller asleep on a reply ring instead is woken by that ring: read_for.) */
static void complete(PfbDispatchCall* call, uint32_t state, const PfbDispatchCall* own) {
  /* Read first: a waiting caller may reuse the call once it sees the state. */
  void (*on_end)(PfbDispatchCall*, void*) = call->on_end;
  void* arg = call->on_end_arg;
  __atomic_store_n(&call->state, state, SC);
  /* (A posted call's poster may wait too, pfb_dispatch_wait: woken before
   * on_end, after which the call may be gone.) */
  if (call != own) pfb_futex_wake(&call->state, INT_MAX, FUTEX_WAKE_PRIVATE);
  if (on_end != NULL) on_end(call, arg);
}

/* Ends a call no DONE answers: RESEND (its function never ran: its caller
 * submits it again), or FAILED with (`code`, `message`). */
static void end_call(PfbDispatch* d, PfbDispatchCall* call, int resend, int32_t code,
                     const char* message, const PfbDispatchCall* own) {
  if (resend) {
    bump(&d->counts.resent, 1);
    complete(call, PFB_DISPATCH_RESEND, own);
    return;
  }
  call->error = strdup(message);
  call->error_code = code;
  complete(call, PFB_DISPATCH_FAILED, own);
}

/* Frees input blocks and wakes the callers waiting for room: those of
 * `offsets` whose `sizes` are not 0 (NULL: all); with `held` (a worker's
 * hand-back), only those it holds, taken out of it: a bogus hand-back
 * changes nothing. */
static void free_blocks(PfbDispatch* d, Words* held, const uint64_t* sizes,
                        const uint64_t* offsets, size_t n) {
  pthread_mutex_lock(&d->arena_lock);
  for (size_t i = 0; i < n; ++i) {
    if ((sizes == NULL || sizes[i]) && (held == NULL || words_remove(held, offsets[i])) &&
        pfb_arena_free(d->arena, offsets[i]) == 0)
      bump(&d->counts.input_blocks, -1);
  }
  pthread_cond_broadcast(&d->room);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Hands the blocks (sizes not 0) to worker `w`: its own until INPUTS_BACK. */
static void hand_blocks(PfbDispatch* d, Worker* w, const uint64_t* sizes,
                        const uint64_t* offsets, uint32_t count) {
  pthread_mutex_lock(&d->arena_lock);
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i]) words_push(&w->inputs, offsets[i]);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Hands back each result block of a DONE in `arena` that nobody takes (its
 * records' blocks, or its error's). */
static void hand_back_results(PfbDispatchArena* arena, const PfbPoolSlot* message) {
  const PfbPoolMessage* m = &message[0].message;
  if (m->status != PFB_POOL_STATUS_OK) {
    if (m->block_size) pfb_dispatch_arena_hand_back(arena, m->block_offset);
    return;
  }
  uint32_t cursor = 1;
  PfbPoolTensor record;
  int64_t dims[PFB_POOL_MAX_NDIM];
  for (uint32_t i = 0; i < m->count; ++i) {
    if (pfb_msg_read_tensor(message, &cursor, &record, dims) != 0) break;
    if (record.size) pfb_dispatch_arena_hand_back(arena, record.offset);
  }
}

void pfb_dispatch_reply_hand_back(PfbDispatchCall* call) {
  if (call->reply != NULL && call->arena != NULL) hand_back_results(call->arena, call->reply);
}

/* ------------------------------------------------------- reply threads -- */

/* Takes a call off w's list of calls in flight: `call` itself (never read:
 * it may be gone), or the one of `id` (ids start at 1); NULL when it is not
 * there (its caller finished it first: abandoned). */
static PfbDispatchCall* unlist(Worker* w, const PfbDispatchCall* call, uint64_t id) {
  PfbDispatchCall* found = NULL;
  pthread_mutex_lock(&w->calls);
  for (PfbDispatchCall** link = &w->pending; *link != NULL; link = &(*link)->next) {
    if (*link == call || (*link)->id == id) {
      found = *link;
      *link = found->next;
      break;
    }
  }
  pthread_mutex_unlock(&w->calls);
  return found;
}

static void on_done(Worker* w, const PfbPoolSlot* message, uint32_t slots,
                    const PfbDispatchCall* own) {
  PfbDispatchCall* call = unlist(w, NULL, message[0].message.call_id);
  /* A credit back (abandoned or not, the worker is done with it): the
   * queue's next call goes to this worker before its caller wakes, so that
   * the worker works meanwhile. */
  pthread_mutex_lock(&w->d->queue_lock);
  if (w->outstanding) __atomic_sub_fetch(&w->outstanding, 1, SC);
  pthread_mutex_unlock(&w->d->queue_lock);
  if (queue_waits(w)) pump_async(w);
  if (__atomic_load_n(&w->d->room_waiters, SC) != 0) {
    /* A submit waiting for room waits only while calls are in flight
     * (alloc_blocks): it looks again. */
    pthread_mutex_lock(&w->d->arena_lock);
    pthread_cond_broadcast(&w->d->room);
    pthread_mutex_unlock(&w->d->arena_lock);
  }
  PfbPoolSlot* copy = call ? (PfbPoolSlot*)malloc(slots * sizeof(PfbPoolSlot)) : NULL;
  if (copy == NULL) {  /* abandoned (or no memory): its blocks go back */
    hand_back_results(w->arena, message);
    if (call != NULL)
      end_call(w->d, call, 0, 8 /* RESOURCE_EXHAUSTED */,
               "pyfunc_bridge: no memory for a pool call's reply", own);
    return;
  }
  memcpy(copy, message, slots * sizeof(PfbPoolSlot));
  call->reply = copy;
  pfb_dispatch_arena_keep(w->arena);
  call->arena = w->arena;
  complete(call, PFB_DISPATCH_DONE, own);
}

/* Reads every message on w's reply ring; the role held.  DONEs complete
 * their calls, INPUTS_BACK frees blocks: whoever holds the role, so that a
 * caller that reads does all the reply thread would.  0, or -1 for a
 * malformed message (the peer broke the protocol: Python ends the worker
 * when its socket ends). */
static int drain(Worker* w, const PfbDispatchCall* own) {
  PfbPoolSlot* buffer = w->reading;
  int n;
  while ((n = pfb_ring_read(&w->replies, buffer, PFB_POOL_MAX_MESSAGE_SLOTS)) > 0) {
    const PfbPoolMessage* m = &buffer[0].message;
    if (m->kind == PFB_POOL_MSG_DONE) {
      on_done(w, buffer, (uint32_t)n, own);
    } else if (m->kind == PFB_POOL_MSG_INPUTS_BACK) {
      uint64_t offsets[64];
      size_t k = 0;
      for (uint32_t i = 0; i < m->count; ++i) {
        if (pfb_msg_read_word(buffer, i, &offsets[k]) != 0) break;  /* malformed: the rest */
        if (++k == 64) {
          free_blocks(w->d, &w->inputs, NULL, offsets, k);
          k = 0;
        }
      }
      if (k) free_blocks(w->d, &w->inputs, NULL, offsets, k);
    }
  }
  return n < 0 ? -1 : 0;
}

enum { ROLE_FREE = 0, ROLE_HELD = 1, ROLE_RETIRED = 2 };

static int role_take(Worker* w) {
  uint32_t free_role = ROLE_FREE;
  return __atomic_compare_exchange_n(&w->role, &free_role, ROLE_HELD, 0, SC, SC);
}

/* Gives the role back.  Neither a message published after the holder's
 * last read nor a queued call this worker could take is left behind: the
 * reply thread, if it sleeps, is woken for them (it announced its sleep
 * before it saw the role held, so this sees it), and its loop reads, posts
 * the queue's calls, and retries a post that found no room. */
static void role_give(Worker* w) {
  __atomic_store_n(&w->role, ROLE_FREE, SC);
  if (pfb_ring_available(&w->replies) || queue_waits(w))
    pfb_ring_wake(&w->replies, PFB_POOL_SLEEPER_READER);
}

/* The reply thread sleeps unless it can read now (or must end). */
static int reader_ready(void* worker) {
  Worker* w = (Worker*)worker;
  uint32_t role = __atomic_load_n(&w->role, SC);
  return role == ROLE_RETIRED || (role == ROLE_FREE && pfb_ring_available(&w->replies));
}

static void* reply_thread(void* arg) {
  Worker* w = (Worker*)arg;
  for (;;) {
    /* Calls wait and this worker could take one: posted now; a post that
     * had to wait (no room) is tried again after RETRY_NS. */
    int64_t timeout = -1;
    if (queue_waits(w)) {
      pump_async(w);
      if (queue_waits(w)) timeout = RETRY_NS;
    }
    if (role_take(w)) {
      if (drain(w, NULL) != 0) {
        __atomic_store_n(&w->role, ROLE_RETIRED, SC);
        break;
      }
      role_give(w);
    }
    uint32_t role = __atomic_load_n(&w->role, SC);
    if (role == ROLE_RETIRED) break;
    /* Closed: ends once drained, or at once while a caller reads (it
     * drains what is left). */
    if (pfb_ring_closed(&w->replies) && !reader_ready(w)) break;
    /* Given up while it sleeps: a waiting caller may read meanwhile. */
    if (pfb_ring_sleep(&w->replies, PFB_POOL_SLEEPER_READER, timeout, reader_ready, w))
      bump(&w->d->counts.reply_sleeps, 1);
  }
  return NULL;
}

/* ------------------------------------------------------------ lifetime -- */

PfbDispatch* pfb_dispatch_new(char* input_base, uint64_t input_bytes, int workers) {
  PfbDispatch* d = (PfbDispatch*)calloc(1, sizeof(PfbDispatch));
  if (d == NULL) return NULL;
  d->arena = pfb_arena_new(input_bytes);
  d->workers = (Worker*)calloc((size_t)workers, sizeof(Worker));
  /* A mapping of its own of the input arena (as for result arenas): a
   * kernel's submit may copy into it while Python closes the pool and
   * unmaps its own. */
  void* mapped = input_bytes ? mremap(input_base, 0, input_bytes, MREMAP_MAYMOVE) : NULL;
  if (d->arena == NULL || d->workers == NULL || mapped == MAP_FAILED) {
    if (mapped != NULL && mapped != MAP_FAILED) munmap(mapped, input_bytes);
    pfb_arena_delete(d->arena);
    free(d->workers);
    free(d);
    return NULL;
  }
  d->input_base = (char*)mapped;
  d->input_bytes = input_bytes;
  d->workers_count = workers;
  d->refs = 1;  /* the creator's */
  pthread_mutex_init(&d->arena_lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&d->room, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&d->tokens_lock, NULL);
  pthread_mutex_init(&d->queue_lock, NULL);
  for (int i = 0; i < workers; ++i) {
    Worker* w = &d->workers[i];
    w->d = d;
    w->index = i;
    w->doorbell = -1;
    w->role = ROLE_RETIRED;  /* until attached */
    pthread_mutex_init(&w->post, NULL);
    pthread_mutex_init(&w->calls, NULL);
    pthread_mutex_init(&w->back_lock, NULL);
  }
  return d;
}

/* A second mapping of a worker's result arena (old size 0 on a shared
 * mapping: the same pages), with the attachment's reference; NULL (errno). */
static PfbDispatchArena* arena_new(PfbDispatch* d, int index, const char* base,
                                   uint64_t bytes) {
  PfbDispatchArena* arena = (PfbDispatchArena*)calloc(1, sizeof(PfbDispatchArena));
  void* mapped = arena && bytes ? mremap((void*)base, 0, bytes, MREMAP_MAYMOVE) : NULL;
  if (arena == NULL || mapped == MAP_FAILED) {
    int err = errno;
    free(arena);
    errno = err;
    return NULL;
  }
  arena->refs = 1;
  arena->d = d;
  pfb_dispatch_retain(d);
  arena->index = index;
  arena->base = (char*)mapped;
  arena->bytes = bytes;
  return arena;
}

/* pfb_dispatch_attach, `post` held. */
static int attach(Worker* w, PfbPoolControl* control, int doorbell, const char* result_base,
                  uint64_t result_bytes, uint64_t generation) {
  if (w->attached || w->has_thread) return EBUSY;  /* lost() first */
  if (w->scratch == NULL)
    w->scratch = (PfbPoolSlot*)malloc(PFB_POOL_MAX_MESSAGE_SLOTS * sizeof(PfbPoolSlot));
  if (w->reading == NULL)
    w->reading = (PfbPoolSlot*)malloc(PFB_POOL_MAX_MESSAGE_SLOTS * sizeof(PfbPoolSlot));
  if (w->scratch == NULL || w->reading == NULL) return ENOMEM;
  /* A descriptor of its own, closed by lost(): Python may close its own
   * while a submit still rings this one. */
  int bell = dup(doorbell);
  PfbDispatchArena* arena =
      bell < 0 ? NULL : arena_new(w->d, w->index, result_base, result_bytes);
  if (arena == NULL) {
    int err = errno;
    if (bell >= 0) close(bell);
    return err;
  }
  w->doorbell = bell;
  pfb_ring_attach(&w->requests, &control->requests, pfb_pool_request_slots(control),
                  control->ring_slots);
  w->requests.doorbell = bell;
  pfb_ring_attach(&w->replies, &control->replies, pfb_pool_reply_slots(control),
                  control->ring_slots);
  w->arena = arena;
  w->control = control;
  w->generation = generation;
  w->posted = 0;
  w->known.count = 0;
  w->forget.count = 0;
  pthread_mutex_lock(&w->back_lock);
  w->back.count = 0;
  pthread_mutex_unlock(&w->back_lock);
  __atomic_store_n(&w->d->ring_slots, w->requests.capacity, SC);
  __atomic_store_n(&w->role, ROLE_FREE, SC);  /* the rings are bound: readable */
  int rc = pthread_create(&w->thread, NULL, reply_thread, w);
  if (rc == 0) {
    w->has_thread = 1;
    __atomic_store_n(&w->attached, 1, SC);
    pthread_mutex_lock(&w->d->queue_lock);
    __atomic_store_n(&w->outstanding, 0, SC);
    if (!w->counted) ++w->d->attached_count;
    w->counted = 1;
    pthread_mutex_unlock(&w->d->queue_lock);
  } else {
    __atomic_store_n(&w->role, ROLE_RETIRED, SC);  /* no call was posted: nobody reads */
    w->arena = NULL;
    pfb_dispatch_arena_drop(arena);
    close(w->doorbell);
    w->doorbell = -1;
  }
  return rc;
}

int pfb_dispatch_attach(PfbDispatch* d, int index, PfbPoolControl* control, int doorbell,
                        const char* result_base, uint64_t result_bytes, uint64_t generation) {
  if (index < 0 || index >= d->workers_count) return EINVAL;
  Worker* w = &d->workers[index];
  pthread_mutex_lock(&w->post);
  /* (Under `post`: delete's lost() of this slot, which takes it too, then
   * comes after, and no attach counts the slot again behind it.) */
  int rc = __atomic_load_n(&d->closed, SC)
               ? EPIPE
               : attach(w, control, doorbell, result_base, result_bytes, generation);
  /* The calls queued meanwhile are posted here: the reply thread's first
   * look may come before `attached` is set, and then sleeps. */
  if (rc == 0) __atomic_store_n(&w->wanted, 1, SC);
  post_unlock(w);
  return rc;
}

void pfb_dispatch_lost(PfbDispatch* d, int index, int32_t code, const char* message,
                       int resend) {
  if (index < 0 || index >= d->workers_count) return;
  Worker* w = &d->workers[index];
  pthread_mutex_lock(&w->post);  /* no producer is under way */
  __atomic_store_n(&w->attached, 0, SC);
  int joined = w->has_thread;
  pthread_t thread = w->thread;
  w->has_thread = 0;
  if (w->doorbell >= 0) close(w->doorbell);  /* no producer is under way, none comes */
  w->doorbell = -1;
  pthread_mutex_unlock(&w->post);
  if (joined) {
    pfb_ring_close(&w->replies);  /* (the caller closed it too: idempotent) */
    pthread_join(thread, NULL);
  }
  /* No reader from now on: a caller that reads drains and leaves once it
   * sees the ring closed (the close woke it), and none takes the role
   * again until the slot is attached anew.  Then nothing below races with
   * a reader (the calls' completions, the arena). */
  for (;;) {
    uint32_t role = ROLE_FREE;
    if (__atomic_compare_exchange_n(&w->role, &role, ROLE_RETIRED, 0, SC, SC) ||
        role == ROLE_RETIRED)
      break;
    usleep(50);
  }
  /* The worker is dead (Python reaped it): what it counted is final.  It
   * starts CALLs in the order they were posted, so those posted after the
   * last one it started never ran. */
  uint64_t started = resend && w->control != NULL
                         ? __atomic_load_n(&w->control->ring_calls_started, SC)
                         : UINT64_MAX;
  /* Its credits go with it; with it the last attached worker goes, the
   * queue goes too (no worker would take it: the callers do, RESEND). */
  Queued* orphans = NULL;
  pthread_mutex_lock(&d->queue_lock);
  __atomic_store_n(&w->outstanding, 0, SC);
  if (w->counted && --d->attached_count == 0) orphans = queue_take(d);
  w->counted = 0;
  pthread_mutex_unlock(&d->queue_lock);
  end_queued(d, orphans);
  pthread_mutex_lock(&w->calls);
  PfbDispatchCall* failed = w->pending;
  w->pending = NULL;
  pthread_mutex_unlock(&w->calls);
  while (failed != NULL) {
    PfbDispatchCall* next = failed->next;
    /* (A resent call's blocks go below with the rest: it is sent anew.) */
    end_call(d, failed, failed->sequence > started, code,
             message ? message : "pyfunc_bridge: the worker ended", NULL);
    failed = next;
  }
  /* It holds nothing any more (and nobody hands it blocks: no reader, no
   * producer is left). */
  free_blocks(d, NULL, NULL, w->inputs.items, w->inputs.count);
  w->inputs.count = 0;
  pthread_mutex_lock(&w->back_lock);
  w->back.count = 0;  /* its arena goes with it */
  PfbDispatchArena* arena = w->arena;
  w->arena = NULL;
  pthread_mutex_unlock(&w->back_lock);
  if (arena != NULL) pfb_dispatch_arena_drop(arena);  /* the attachment's reference */
}

void pfb_dispatch_delete(PfbDispatch* d) {
  if (d == NULL) return;
  __atomic_store_n(&d->closed, 1, SC);
  pthread_mutex_lock(&d->arena_lock);
  pthread_cond_broadcast(&d->room);  /* submits waiting for room: closed */
  pthread_mutex_unlock(&d->arena_lock);
  /* (`closed` set: no call joins the queue or leaves it for a worker from
   * now on, and no worker attaches.) */
  for (int i = 0; i < d->workers_count; ++i)
    pfb_dispatch_lost(d, i, FAILED_PRECONDITION, CLOSED_TEXT, 0);
  pthread_mutex_lock(&d->queue_lock);
  Queued* queued = queue_take(d);  /* (the last lost() took it, if a worker was attached) */
  pthread_mutex_unlock(&d->queue_lock);
  end_queued(d, queued);
  /* What only calls use goes now, not with the last reference (a route a
   * kernel or the statistics keep): the input mapping, once no submit
   * copies into it (each sees `closed`, or its ring closed, at once), and
   * the functions. */
  while (__atomic_load_n(&d->active, SC) != 0) usleep(100);
  if (d->input_base != NULL) munmap(d->input_base, d->input_bytes);
  d->input_base = NULL;
  pthread_mutex_lock(&d->tokens_lock);
  Token* tokens = d->tokens;
  d->tokens = NULL;
  pthread_mutex_unlock(&d->tokens_lock);
  while (tokens != NULL) {
    Token* next = tokens->next;
    token_drop(tokens);
    tokens = next;
  }
  pfb_dispatch_release(d);
}

void pfb_dispatch_disown(PfbDispatch* d) {
  __atomic_store_n(&d->closed, 1, SC);
  pfb_dispatch_retain(d);  /* never freed: its threads and rings are not this process's */
  /* This process's copies of the doorbells: no submit rings one from now on. */
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    __atomic_store_n(&w->attached, 0, SC);
    if (w->doorbell >= 0) close(w->doorbell);
    w->doorbell = -1;
  }
}

void pfb_dispatch_retain(PfbDispatch* d) { __atomic_add_fetch(&d->refs, 1, SC); }

/* The last reference: delete lost every worker, unmapped the inputs and
 * dropped the functions; no route or arena refers to it any more. */
static void destroy(PfbDispatch* d) {
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    free(w->known.items);
    free(w->forget.items);
    free(w->back.items);
    free(w->inputs.items);
    free(w->scratch);
    free(w->reading);
    pthread_mutex_destroy(&w->post);
    pthread_mutex_destroy(&w->calls);
    pthread_mutex_destroy(&w->back_lock);
  }
  pfb_arena_delete(d->arena);
  pthread_mutex_destroy(&d->queue_lock);
  pthread_cond_destroy(&d->room);
  pthread_mutex_destroy(&d->arena_lock);
  pthread_mutex_destroy(&d->tokens_lock);
  free(d->workers);
  free(d);
}

void pfb_dispatch_release(PfbDispatch* d) {
  if (d != NULL && __atomic_sub_fetch(&d->refs, 1, SC) == 0) destroy(d);
}

/* -------------------------------------------------------------- tokens -- */

static Token* find_token(PfbDispatch* d, uint64_t token) {
  for (Token* t = d->tokens; t != NULL; t = t->next)
    if (t->token == token) return t;
  return NULL;
}

int pfb_dispatch_register(PfbDispatch* d, uint64_t token, const void* payload, uint64_t size) {
  Token* t = (Token*)calloc(1, sizeof(Token));
  void* copy = malloc(size ? size : 1);
  if (t == NULL || copy == NULL) {
    free(t);
    free(copy);
    return ENOMEM;
  }
  memcpy(copy, payload, size);
  t->refs = 1;  /* the registry's */
  t->token = token;
  t->payload = copy;
  t->size = size;
  pthread_mutex_lock(&d->tokens_lock);
  /* Registered already: the first stays.  Closed: delete dropped the
   * functions, and nothing would drop this one. */
  int closed = __atomic_load_n(&d->closed, SC);
  int known = closed || find_token(d, token) != NULL;
  if (!known) {
    t->next = d->tokens;
    d->tokens = t;
  }
  pthread_mutex_unlock(&d->tokens_lock);
  if (known) token_drop(t);
  return closed ? EPIPE : 0;
}

void pfb_dispatch_forget(PfbDispatch* d, uint64_t token) {
  pthread_mutex_lock(&d->tokens_lock);
  for (Token** link = &d->tokens; *link != NULL; link = &(*link)->next) {
    if ((*link)->token == token) {
      Token* t = *link;
      *link = t->next;
      token_drop(t);
      break;
    }
  }
  pthread_mutex_unlock(&d->tokens_lock);
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    pthread_mutex_lock(&w->post);
    if (words_remove(&w->known, token)) words_push(&w->forget, token);
    pthread_mutex_unlock(&w->post);
  }
}

/* -------------------------------------------------------------- submit -- */

/* A deadline that is already past: a post that would wait gives up at once
 * (a reply thread must never wait for its own worker). */
#define NOW 0

/* Whether any worker has CALLs posted and not answered (whose inputs come
 * back after them).  Queued calls do not count: their blocks are held, and
 * come back only through a post. */
static int native_in_flight(PfbDispatch* d) {
  for (int i = 0; i < d->workers_count; ++i)
    if (__atomic_load_n(&d->workers[i].outstanding, SC) != 0) return 1;
  return 0;
}

/* Blocks for `count` sizes, all or none, waiting for room until `deadline`
 * (negative: none) while native calls are in flight; ENOSPC when none is.
 * Sizes of 0 get no block (offset 0). */
static int alloc_blocks(PfbDispatch* d, const uint64_t* sizes, uint32_t count,
                        uint64_t* offsets, int64_t deadline) {
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i] > d->input_bytes) return E2BIG;
  pthread_mutex_lock(&d->arena_lock);
  for (;;) {
    if (__atomic_load_n(&d->closed, SC)) {
      pthread_mutex_unlock(&d->arena_lock);
      return EPIPE;
    }
    uint32_t got = 0;
    for (; got < count; ++got) {
      uint64_t size;
      offsets[got] = 0;
      if (sizes[got] && pfb_arena_alloc(d->arena, sizes[got], &offsets[got], &size) != 0)
        break;
    }
    if (got == count) {
      for (uint32_t i = 0; i < count; ++i)
        if (sizes[i]) bump(&d->counts.input_blocks, 1);
      pthread_mutex_unlock(&d->arena_lock);
      return 0;
    }
    for (uint32_t i = 0; i < got; ++i)
      if (sizes[i]) pfb_arena_free(d->arena, offsets[i]);
    /* Inputs come back as workers let go of them (INPUTS_BACK), after
     * their calls.  With no call in flight, the room there is now is all
     * there will be (functions keep the rest): the caller hears ENOSPC at
     * once rather than after the timeout, and pulls inputs instead
     * (route.pxi, _move_to_socket). */
    /* Counted before `outstanding` is read (on_done lowers it, then reads
     * this): either this sees the DONE, or its reply thread sees this
     * waiter and wakes it. */
    __atomic_add_fetch(&d->room_waiters, 1, SC);
    int rc = !native_in_flight(d) ? ENOSPC
             : deadline >= 0 && pfb_now_ns() >= deadline ? ETIMEDOUT : 0;
    if (rc != 0) {
      __atomic_sub_fetch(&d->room_waiters, 1, SC);
      pthread_mutex_unlock(&d->arena_lock);
      return rc;
    }
    struct timespec limit;
    if (deadline >= 0)
      pthread_cond_timedwait(&d->room, &d->arena_lock, pfb_timespec(deadline, &limit));
    else
      pthread_cond_wait(&d->room, &d->arena_lock);
    __atomic_sub_fetch(&d->room_waiters, 1, SC);
  }
}


/* Posts one built message on w's request ring, waiting for room until
 * `deadline` (NOW: not at all); `post` held. */
static int post_message(Worker* w, const PfbPoolSlot* message, int64_t deadline) {
  uint32_t slots = message[0].message.slots;
  int64_t left = pfb_left_ns(deadline);
  uint64_t rung = w->requests.wakes;
  /* (A wait for room rings a sleeping worker first: the hand-backs that
   * post_back left there may fill its ring.) */
  int rc = pfb_ring_wait_room(&w->requests, slots, left);
  bump(&w->d->counts.doorbells, (int64_t)(w->requests.wakes - rung));
  if (rc != 0) return rc;
  return pfb_ring_write(&w->requests, message);
}

/* Posts `list` as `kind` messages of words, as many as the ring takes now
 * while `keep` slots stay free, and keeps the rest for next time; `post`
 * held. */
static void post_words(Worker* w, uint16_t kind, Words* list, uint32_t keep) {
  uint32_t per = PFB_POOL_WORDS_PER_SLOT *
                 (w->requests.capacity > 64 ? 63 : w->requests.capacity - 1);
  size_t sent = 0;
  while (sent < list->count) {
    pfb_msg_init(w->scratch, kind);
    size_t k = 0;
    for (; k < per && sent + k < list->count; ++k)
      pfb_msg_add_word(w->scratch, PFB_POOL_MAX_MESSAGE_SLOTS, list->items[sent + k]);
    if (pfb_ring_room(&w->requests) < w->scratch[0].message.slots + keep) break;
    if (pfb_ring_write(&w->requests, w->scratch) != 0) break;  /* no room now */
    sent += k;
  }
  memmove(list->items, list->items + sent, (list->count - sent) * sizeof(uint64_t));
  list->count -= sent;
}

/* Posts the tokens to forget, then the result blocks waiting to go back
 * to `w`, leaving `keep` slots for the call they come with; `post` held.
 * What has no room now goes next time. */
static void post_back(Worker* w, uint32_t keep) {
  post_words(w, PFB_POOL_MSG_FORGET, &w->forget, keep);
  pthread_mutex_lock(&w->back_lock);
  post_words(w, PFB_POOL_MSG_RESULTS_BACK, &w->back, keep);
  pthread_mutex_unlock(&w->back_lock);
}

static void notify(Worker* w) {
  uint64_t rung = w->requests.wakes;
  pfb_ring_notify(&w->requests);  /* rings only a worker that sleeps */
  bump(&w->d->counts.doorbells, (int64_t)(w->requests.wakes - rung));
}

/* ------------------------------------------------------------ the queue -- */

/* A worker whose call has run this long takes no call more while it has
 * one of ours (whose DONE asks again): calls posted to it would wait
 * behind a function that may never return.  Long next to a call's round
 * trip (~50 us), short next to what a stuck call costs the calls behind
 * it. */
#define LONG_CALL_NS 20000000

/* Whether w's running call (the worker shows it in its control segment)
 * has run LONG_CALL_NS. */
static int held(Worker* w, int64_t now) {
  uint64_t running = __atomic_load_n(&w->control->running_call, __ATOMIC_ACQUIRE);
  uint64_t since = __atomic_load_n(&w->control->running_since, __ATOMIC_RELAXED);
  return running != 0 && since != 0 && now - (int64_t)since > LONG_CALL_NS;
}

/* Whether w may take one call more now: attached, under its credits, and
 * not held by a long call while it has one of ours.  (Held with none of
 * ours, by a call posted by a test's own producer, it keeps its credits: no
 * DONE of ours would come to ask again.)  Exact under `queue_lock` with `post`
 * held, a hint otherwise. */
static int has_credit(Worker* w, int64_t now) {
  if (!__atomic_load_n(&w->attached, SC)) return 0;
  uint32_t n = __atomic_load_n(&w->outstanding, SC);
  return n < CREDITS && (n == 0 || !held(w, now));
}

/* Whether calls wait that w could take now (a hint). */
static int queue_waits(Worker* w) {
  return __atomic_load_n(&w->d->counts.queued, SC) != 0 && has_credit(w, pfb_now_ns());
}

/* The worker for the queue's next call: among those with credit, one not
 * held by a long call if there is one, then the fewest outstanding; NULL
 * when none has credit (a hint: the post rechecks under the locks). */
static Worker* choose(PfbDispatch* d) {
  Worker* best = NULL;
  int best_held = 1;
  uint32_t fewest = UINT32_MAX;
  int64_t now = pfb_now_ns();
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    if (!has_credit(w, now)) continue;
    uint32_t n = __atomic_load_n(&w->outstanding, __ATOMIC_RELAXED);
    int h = held(w, now);
    if ((!h && best_held) || (h == best_held && n < fewest)) {
      fewest = n;
      best = w;
      best_held = h;
    }
  }
  return best;
}

/* The queue's operations; `queue_lock` held.  `counts.queued` follows. */
static void queue_push(PfbDispatch* d, Queued* q, int front) {
  if (front) {
    q->next = d->queue_head;
    d->queue_head = q;
    if (d->queue_tail == NULL) d->queue_tail = q;
  } else {
    q->next = NULL;
    if (d->queue_tail != NULL) d->queue_tail->next = q;
    else d->queue_head = q;
    d->queue_tail = q;
  }
  bump(&d->counts.queued, 1);
}

/* Takes the node of `call` out of the queue (NULL: not there). */
static Queued* queue_remove(PfbDispatch* d, PfbDispatchCall* call) {
  Queued* before = NULL;
  for (Queued* q = d->queue_head; q != NULL; before = q, q = q->next) {
    if (q->call != call) continue;
    if (before != NULL) before->next = q->next;
    else d->queue_head = q->next;
    if (d->queue_tail == q) d->queue_tail = before;
    q->next = NULL;
    bump(&d->counts.queued, -1);
    return q;
  }
  return NULL;
}

/* Empties the queue: its nodes, as a list. */
static Queued* queue_take(PfbDispatch* d) {
  Queued* all = d->queue_head;
  uint64_t n = 0;
  for (Queued* q = all; q != NULL; q = q->next) ++n;
  d->queue_head = d->queue_tail = NULL;
  bump(&d->counts.queued, -(int64_t)n);
  return all;
}

/* A node for a call of `inputs`, taking the caller's reference on `fn`:
 * its `sizes` set (an input pulled over the socket has no block,
 * shm_layout.h), its `offsets` for the caller to allocate, its CALL for
 * queued_build.  NULL: no memory. */
static Queued* queued_new(Token* fn, const PfbDispatchInput* inputs, uint32_t count,
                          uint32_t slots, PfbDispatchCall* call) {
  size_t head = (sizeof(Queued) + 63) & ~(size_t)63;
  size_t words = ((2 * (size_t)count * sizeof(uint64_t)) + 63) & ~(size_t)63;
  char* memory = (char*)malloc(head + words + (size_t)slots * sizeof(PfbPoolSlot));
  if (memory == NULL) return NULL;
  Queued* q = (Queued*)memory;
  q->next = NULL;
  q->call = call;
  q->fn = fn;
  q->count = count;
  q->sizes = (uint64_t*)(memory + head);
  q->offsets = q->sizes + count;
  q->message = (PfbPoolSlot*)(memory + head + words);
  for (uint32_t i = 0; i < count; ++i)
    q->sizes[i] = inputs[i].flags & PFB_POOL_TENSOR_SOCKET ? 0 : inputs[i].nbytes;
  return q;
}

/* Builds q's CALL (`slots` long) over its blocks. */
static void queued_build(Queued* q, uint32_t flags, const PfbDispatchInput* inputs,
                         uint32_t slots) {
  pfb_msg_init(q->message, PFB_POOL_MSG_CALL);
  PfbPoolMessage* m = &q->message[0].message;
  m->call_id = q->call->id;
  m->token = q->fn->token;
  m->flags = flags;
  for (uint32_t i = 0; i < q->count; ++i) {
    PfbPoolTensor record;
    memset(&record, 0, sizeof(record));
    record.code = inputs[i].code;
    record.bits = inputs[i].bits;
    record.lanes = inputs[i].lanes;
    record.flags = inputs[i].flags;
    record.ndim = inputs[i].ndim;
    /* A pulled input has no block: its record names the payload (shm_layout.h). */
    record.offset = inputs[i].flags & PFB_POOL_TENSOR_SOCKET ? inputs[i].nbytes : q->offsets[i];
    record.size = q->sizes[i];
    pfb_msg_add_tensor(q->message, slots, &record, inputs[i].dims);  /* sized to fit */
  }
}

/* Frees a node; with `release`, its blocks go back to the arena (a call
 * no worker got). */
static void queued_free(PfbDispatch* d, Queued* q, int release) {
  if (release) free_blocks(d, NULL, q->sizes, q->offsets, q->count);
  token_drop(q->fn);
  free(q);
}

/* Ends the calls of `list`, which no worker got: FAILED once the
 * dispatcher is closed, otherwise RESEND (no worker is attached: the caller
 * submits again, gets EAGAIN, and the pool waits for the replacement,
 * ProcessPool.ring_call). */
static void end_queued(PfbDispatch* d, Queued* list) {
  int closed = __atomic_load_n(&d->closed, SC);
  while (list != NULL) {
    Queued* next = list->next;
    PfbDispatchCall* call = list->call;
    queued_free(d, list, 1);
    end_call(d, call, !closed, FAILED_PRECONDITION, CLOSED_TEXT, NULL);
    list = next;
  }
}


/* Posts q's LOAD (when w lacks its function) and its CALL, waiting for
 * room until `deadline` (NOW: no wait, and nothing posted unless both fit
 * now); `post` held.  0, or an errno: the CALL was not posted. */
static int post_call(PfbDispatch* d, Worker* w, Queued* q, int64_t deadline) {
  uint32_t slots = q->message[0].message.slots;
  if (!pfb_pool_message_fits(slots, w->requests.capacity)) return E2BIG;
  int load = words_find(&w->known, q->fn->token) < 0;
  post_back(w, slots + (uint32_t)load);
  if (deadline == NOW && pfb_ring_room(&w->requests) < slots + (uint32_t)load) return EAGAIN;
  if (load) {
    uint64_t load_size = q->fn->size, load_offset = 0;
    int rc = alloc_blocks(d, &load_size, 1, &load_offset, deadline);
    uint32_t load_flags = 0;
    if (rc == ENOSPC || rc == E2BIG) {  /* no room: the worker pulls it (shm_layout.h) */
      load_size = load_offset = 0;
      load_flags = PFB_POOL_LOAD_SOCKET;
      rc = 0;
    }
    if (rc != 0) return rc;
    if (load_size) memcpy(d->input_base + load_offset, q->fn->payload, load_size);
    pfb_msg_init(w->scratch, PFB_POOL_MSG_LOAD);
    w->scratch[0].message.flags = load_flags;
    w->scratch[0].message.token = q->fn->token;
    w->scratch[0].message.block_offset = load_offset;
    w->scratch[0].message.block_size = load_size;
    rc = post_message(w, w->scratch, deadline);
    if (rc != 0) {
      free_blocks(d, NULL, &load_size, &load_offset, 1);
      return rc;
    }
    hand_blocks(d, w, &load_size, &load_offset, 1);
    words_push(&w->known, q->fn->token);
    bump(&d->counts.loads, 1);
  }
  q->message[0].message.stamp = (uint64_t)pfb_clock_ns(CLOCK_REALTIME);
  /* Counted once its LOAD is posted (a LOAD waits for room only while
   * other calls are in flight), before the CALL (its DONE may come at
   * once); only a holder of `post` adds to it. */
  __atomic_add_fetch(&w->outstanding, 1, SC);
  int rc = post_message(w, q->message, deadline);
  if (rc != 0) {
    pthread_mutex_lock(&d->queue_lock);
    __atomic_sub_fetch(&w->outstanding, 1, SC);
    pthread_mutex_unlock(&d->queue_lock);
  }
  return rc;
}

/* Posts the queue's first calls to w while it has credit, each waiting for
 * room until `deadline`; `post` held, w attached.  Returns 0, or the errno
 * of a post that must wait (that call back at the front).  A call whose
 * post fails for good ends RESEND (its function never ran), except `own`
 * (the submitter's): its errno is left in *own_rc, its blocks freed. */
static int pump(PfbDispatch* d, Worker* w, int64_t deadline, PfbDispatchCall* own,
                int* own_rc) {
  int posted = 0, waits = 0;
  for (;;) {
    pthread_mutex_lock(&d->queue_lock);
    if (__atomic_load_n(&d->closed, SC) || d->queue_head == NULL ||
        !has_credit(w, pfb_now_ns())) {
      pthread_mutex_unlock(&d->queue_lock);
      break;
    }
    Queued* q = queue_remove(d, d->queue_head->call);
    PfbDispatchCall* call = q->call;
    call->generation = w->generation;
    call->sequence = ++w->posted;
    __atomic_store_n(&call->worker, w->index, SC);  /* its caller may read w's ring now */
    /* Listed before it is posted: its DONE may come at once. */
    pthread_mutex_lock(&w->calls);
    call->next = w->pending;
    w->pending = call;
    pthread_mutex_unlock(&w->calls);
    pthread_mutex_unlock(&d->queue_lock);
    int rc = post_call(d, w, q, deadline);
    if (rc == 0) {
      hand_blocks(d, w, q->sizes, q->offsets, q->count);
      queued_free(d, q, 0);
      posted = 1;
      continue;
    }
    /* Not posted: the list entry goes back, and the call waits again at
     * the front, unless it must not. */
    --w->posted;
    int again = rc == EAGAIN || rc == ETIMEDOUT || rc == EPIPE;
    pthread_mutex_lock(&d->queue_lock);
    int listed = unlist(w, call, 0) != NULL;
    int requeued = listed && again && !__atomic_load_n(&d->closed, SC) &&
                   d->attached_count > 0;
    if (listed) {
      /* Not w's: a caller that reads w's ring for it stops (read_for). */
      __atomic_store_n(&call->worker, -1, SC);
      pfb_ring_wake(&w->replies, PFB_POOL_SLEEPER_CALLER);
    }
    if (requeued) queue_push(d, q, 1);
    pthread_mutex_unlock(&d->queue_lock);
    if (requeued) {
      waits = rc;
      break;
    }
    if (!listed) {  /* abandoned meanwhile: nobody waits for it */
      queued_free(d, q, 1);
    } else if (call == own && !again) {
      queued_free(d, q, 1);
      *own_rc = rc;
    } else {
      end_queued(d, q);  /* closed, or no worker left */
    }
  }
  if (posted) notify(w);
  return waits;
}

/* Runs the posts asked for while `post` was busy; a post that must wait
 * is left to w's reply thread (RETRY_NS). */
static void pump_async(Worker* w) {
  __atomic_store_n(&w->wanted, 1, SC);
  while (__atomic_load_n(&w->wanted, SC) && pthread_mutex_trylock(&w->post) == 0) {
    __atomic_store_n(&w->wanted, 0, SC);
    if (w->attached) pump(w->d, w, NOW, NULL, NULL);
    pthread_mutex_unlock(&w->post);
  }
}

/* Unlocks `post`; then runs what a reply thread asked for meanwhile. */
static void post_unlock(Worker* w) {
  pthread_mutex_unlock(&w->post);
  if (__atomic_load_n(&w->wanted, SC)) pump_async(w);
}

/* The slots of a CALL of these inputs, its header included. */
static uint64_t call_slots(const PfbDispatchInput* inputs, uint32_t count) {
  uint64_t slots = 1;
  for (uint32_t i = 0; i < count; ++i) slots += pfb_pool_tensor_slots(inputs[i].ndim);
  return slots;
}

static int submit(PfbDispatch* d, uint64_t token, uint32_t flags,
                  const PfbDispatchInput* inputs, uint32_t count, int64_t timeout_ns,
                  PfbDispatchCall* call) {
  int64_t deadline = pfb_deadline_ns(timeout_ns);
  for (uint32_t i = 0; i < count; ++i)
    if (inputs[i].ndim < 0 || inputs[i].ndim > PFB_POOL_MAX_NDIM) return EINVAL;
  uint32_t ring_slots = __atomic_load_n(&d->ring_slots, SC);
  if (ring_slots == 0) return EAGAIN;  /* no worker was ever attached */
  uint64_t call_length = call_slots(inputs, count);
  if (!pfb_pool_message_fits(call_length, ring_slots)) return E2BIG;
  uint32_t slots = (uint32_t)call_length;  /* fits: at most PFB_POOL_MAX_MESSAGE_SLOTS */
  pthread_mutex_lock(&d->tokens_lock);
  Token* fn = find_token(d, token);
  if (fn != NULL) __atomic_add_fetch(&fn->refs, 1, SC);  /* a forget meanwhile: LOADed still */
  pthread_mutex_unlock(&d->tokens_lock);
  if (fn == NULL) return ENOENT;
  Queued* q = queued_new(fn, inputs, count, slots, call);
  if (q == NULL) {
    token_drop(fn);
    return ENOMEM;
  }
  int rc = alloc_blocks(d, q->sizes, count, q->offsets, deadline);
  if (rc != 0) {
    queued_free(d, q, 0);
    return rc;
  }
  /* The copy in: the one copy of a call's inputs, outside every lock. */
  for (uint32_t i = 0; i < count; ++i)
    if (q->sizes[i]) memcpy(d->input_base + q->offsets[i], inputs[i].data, q->sizes[i]);
  /* Unique in the process: a DONE's answer that went by the socket is
   * found by its id alone (pyfunc_bridge/pool/answers.py, native_reply). */
  call->id = __atomic_add_fetch(&next_call_id, 1, SC);
  call->state = PFB_DISPATCH_WAITING;
  queued_build(q, flags, inputs, slots);
  /* Every call joins the queue (its blocks the queue's now), behind the
   * calls that wait: first come, first posted. */
  pthread_mutex_lock(&d->queue_lock);
  rc = __atomic_load_n(&d->closed, SC) ? EPIPE : d->attached_count == 0 ? EAGAIN : 0;
  if (rc == 0) queue_push(d, q, 0);
  pthread_mutex_unlock(&d->queue_lock);
  if (rc != 0) {
    queued_free(d, q, 1);
    return rc;
  }
  bump(&d->counts.calls, 1);
  /* Then posted by this thread to workers with credit, as far as it goes;
   * what stays queued the reply threads post as DONEs come. */
  for (int tries = 0; tries < 4 * d->workers_count + 4; ++tries) {
    Worker* w = choose(d);
    if (w == NULL) break;
    pthread_mutex_lock(&w->post);
    int own_rc = 0, waits = 0;
    if (w->attached) waits = pump(d, w, deadline, call, &own_rc);
    post_unlock(w);
    if (own_rc != 0) {
      rc = own_rc;
      break;
    }
    pthread_mutex_lock(&d->queue_lock);
    int done = call->worker >= 0 || d->queue_head == NULL;
    pthread_mutex_unlock(&d->queue_lock);
    if (done || waits) break;
  }
  return rc;
}

/* What a caller that reads w's ring for `call` sleeps until. */
typedef struct Reading {
  Worker* w;
  PfbDispatchCall* call;
} Reading;

static int caller_ready(void* reading) {
  Reading* r = (Reading*)reading;
  return __atomic_load_n(&r->call->state, SC) != PFB_DISPATCH_WAITING ||
         __atomic_load_n(&r->call->worker, SC) != r->w->index ||
         pfb_ring_available(&r->w->replies);
}

/* Reads w's reply ring, the role held, until `call` is done, leaves w (a
 * post that failed), the ring closes (drained first, as the reply thread
 * would), or `deadline`.  Its own DONE wakes it from the worker directly.
 * Whoever else ends the call while it sleeps here wakes it through the
 * ring: lost() closes it, and a post that fails moves the call off w first
 * (pump).  0, or ETIMEDOUT. */
static int read_for(Worker* w, PfbDispatchCall* call, int64_t deadline) {
  Reading reading = {w, call};
  for (;;) {
    if (drain(w, call) != 0) {
      __atomic_store_n(&w->role, ROLE_RETIRED, SC);  /* nobody reads a broken ring */
      return 0;
    }
    if (__atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING ||
        __atomic_load_n(&call->worker, SC) != w->index || pfb_ring_closed(&w->replies))
      return 0;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    pfb_ring_sleep(&w->replies, PFB_POOL_SLEEPER_CALLER, left, caller_ready, &reading);
  }
}

/* Sleeps until the call is DONE, FAILED or RESEND (0), or `timeout_ns`
 * passed (ETIMEDOUT; negative: no limit), reading its worker's reply ring
 * itself while it holds the reader role (docs/pool.md, "A kernel's native
 * call", step 5). */
static int wait_call(PfbDispatchCall* call, int64_t timeout_ns) {
  int64_t deadline = pfb_deadline_ns(timeout_ns);
  int tried = 0;
  for (;;) {
    if (__atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING) return 0;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    /* Posted, and nobody reads its worker's ring: this caller does. */
    int index = __atomic_load_n(&call->worker, SC);
    if (!tried && index >= 0 && index < call->d->workers_count) {
      Worker* w = &call->d->workers[index];
      if (role_take(w)) {
        int rc = 0;
        if (w->generation == call->generation) {
          bump(&call->d->counts.caller_reads, 1);
          rc = read_for(w, call, deadline);
        }
        if (__atomic_load_n(&w->role, SC) == ROLE_HELD) role_give(w);
        if (rc == ETIMEDOUT) return rc;
        /* Not done: its call moved, or the ring closed (lost() ends the
         * call): whoever ends it wakes the state. */
        tried = 1;
        continue;
      }
      /* The reply thread (or another caller) reads: it completes this one.
       * (Tried once per wake-up: a look each time round would spin.) */
      tried = 1;
    }
    pfb_futex_wait(&call->state, PFB_DISPATCH_WAITING, left, FUTEX_WAIT_PRIVATE);
    tried = 0;
  }
}

/* Takes a submitted call that is not completed out of the dispatcher's
 * hands: 1, out of the queue (its blocks back: no worker saw it) or off its
 * worker's list (its results go back when its DONE comes); 0, not found:
 * completed meanwhile (whoever ends a call unlists it first, then publishes
 * the state). */
static int take_out(PfbDispatch* d, PfbDispatchCall* call) {
  pthread_mutex_lock(&d->queue_lock);
  int worker = call->worker;
  Queued* q = worker < 0 ? queue_remove(d, call) : NULL;
  pthread_mutex_unlock(&d->queue_lock);
  if (q != NULL) {
    queued_free(d, q, 1);
    return 1;
  }
  return worker >= 0 && unlist(&d->workers[worker], call, 0) != NULL;
}

int pfb_dispatch_wait(PfbDispatchCall* call, int64_t wait_ns) {
  return call->id == 0 ? 0 : wait_call(call, wait_ns);
}

int pfb_dispatch_abandon(PfbDispatch* d, PfbDispatchCall* call) {
  if (call->id == 0 || __atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING ||
      !take_out(d, call))
    return 0;
  call->id = 0;  /* nothing left for finish to end */
  return 1;
}

void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call) {
  if (call->id != 0 && __atomic_load_n(&call->state, SC) == PFB_DISPATCH_WAITING &&
      !take_out(d, call)) {
    /* Completed meanwhile: wait for the state; its result blocks go back,
     * as an abandoned call's do. */
    wait_call(call, -1);
    pfb_dispatch_reply_hand_back(call);
  }
  free(call->reply);
  free(call->error);
  pfb_dispatch_arena_drop(call->arena);
  call->reply = NULL;
  call->error = NULL;
  call->arena = NULL;
  call->id = 0;  /* finished: a later pfb_dispatch_call submits it anew */
}

int pfb_dispatch_call(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      int64_t wait_ns, PfbDispatchCall* call) {
  for (;;) {
    if (call->id == 0) {  /* not submitted yet, or resent */
      memset(call, 0, sizeof(*call));
      call->d = d;
      call->worker = -1;
      /* Counted first, then `closed` checked: delete sets `closed`, then
       * waits for the count, so no submit touches the input mapping once it
       * goes. */
      __atomic_add_fetch(&d->active, 1, SC);
      int rc = __atomic_load_n(&d->closed, SC)
                   ? EPIPE
                   : submit(d, token, flags, inputs, count, room_ns, call);
      __atomic_sub_fetch(&d->active, 1, SC);
      if (rc != 0) {
        call->id = 0;  /* not submitted: nothing for finish to end */
        return rc;
      }
    }
    int rc = wait_call(call, wait_ns);
    if (rc != 0 || call->state != PFB_DISPATCH_RESEND) return rc;
    /* Its worker died before it started the call: the function never ran,
     * so it is submitted again (while no worker is attached: EAGAIN). */
    pfb_dispatch_finish(d, call);
  }
}

int pfb_dispatch_post(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      PfbDispatchCall* call, void (*on_end)(PfbDispatchCall*, void*),
                      void* arg) {
  memset(call, 0, sizeof(*call));
  call->d = d;
  call->worker = -1;
  call->on_end = on_end;
  call->on_end_arg = arg;
  /* (Counted, then `closed` checked: as in pfb_dispatch_call.) */
  __atomic_add_fetch(&d->active, 1, SC);
  int rc = __atomic_load_n(&d->closed, SC)
               ? EPIPE
               : submit(d, token, flags, inputs, count, room_ns, call);
  __atomic_sub_fetch(&d->active, 1, SC);
  if (rc != 0) call->id = 0;
  return rc;
}

/* ------------------------------------------------------------- results -- */

void pfb_dispatch_arena_keep(PfbDispatchArena* arena) {
  __atomic_add_fetch(&arena->refs, 1, SC);
}

void pfb_dispatch_arena_drop(PfbDispatchArena* arena) {
  if (arena == NULL || __atomic_sub_fetch(&arena->refs, 1, SC) != 0) return;
  if (arena->base != NULL) munmap(arena->base, arena->bytes);
  pfb_dispatch_release(arena->d);
  free(arena);
}

void pfb_dispatch_arena_hand_back(PfbDispatchArena* arena, uint64_t offset) {
  Worker* w = &arena->d->workers[arena->index];
  pthread_mutex_lock(&w->back_lock);
  /* Only to the worker that wrote it (lost() clears w->arena under this
   * lock): a later worker in the slot has an arena of its own. */
  if (w->arena == arena) words_push(&w->back, offset);  /* (no memory: the block stays lost) */
  pthread_mutex_unlock(&w->back_lock);
}

uint64_t pfb_dispatch_free_bytes(PfbDispatch* d) {
  pthread_mutex_lock(&d->arena_lock);
  uint64_t n = pfb_arena_free_bytes(d->arena);
  pthread_mutex_unlock(&d->arena_lock);
  return n;
}

int pfb_dispatch_fits(PfbDispatch* d, const PfbDispatchInput* inputs, uint32_t count) {
  return pfb_pool_message_fits(call_slots(inputs, count), __atomic_load_n(&d->ring_slots, SC));
}

/* -------------------------------------------------------------- routes -- */

/* Every route's (dispatch.h, PfbDispatchApi). */
static const PfbDispatchApi api = {
    pfb_dispatch_call,       pfb_dispatch_finish,
    pfb_msg_read_tensor,     pfb_dispatch_arena_keep, pfb_dispatch_arena_drop,
    pfb_dispatch_arena_hand_back, pfb_dispatch_route_keep, pfb_dispatch_route_drop,
    pfb_dispatch_reply_hand_back, pfb_dispatch_post, pfb_dispatch_abandon,
    pfb_dispatch_wait};

PfbDispatchRoute* pfb_dispatch_route_new(PfbDispatch* d, uint64_t token, uint32_t flags) {
  PfbDispatchRoute* route = (PfbDispatchRoute*)calloc(1, sizeof(PfbDispatchRoute));
  if (route == NULL) return NULL;
  route->refs = 1;
  route->api = &api;
  route->d = d;
  pfb_dispatch_retain(d);
  route->token = token;
  route->flags = flags;
  route->counting = &counting_on;
  return route;
}

void pfb_dispatch_route_keep(PfbDispatchRoute* route) {
  __atomic_add_fetch(&route->refs, 1, SC);
}

void pfb_dispatch_route_drop(PfbDispatchRoute* route) {
  if (route == NULL || __atomic_sub_fetch(&route->refs, 1, SC) != 0) return;
  pfb_dispatch_release(route->d);
  free(route);
}

void pfb_dispatch_set_counting(int on) { __atomic_store_n(&counting_on, on ? 1 : 0, SC); }

void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out) {
  /* (Every field a uint64_t counter.) */
  uint64_t* from = (uint64_t*)&d->counts;
  for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); ++i)
    ((uint64_t*)out)[i] = __atomic_load_n(&from[i], SC);
}
