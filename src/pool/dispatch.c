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

static int words_remove(Words* w, uint64_t value) {
  for (size_t i = 0; i < w->count; ++i) {
    if (w->items[i] == value) {
      w->items[i] = w->items[--w->count];
      return 1;
    }
  }
  return 0;
}

static int words_has(const Words* w, uint64_t value) {
  for (size_t i = 0; i < w->count; ++i)
    if (w->items[i] == value) return 1;
  return 0;
}

static void token_drop(Token* t) {
  if (__atomic_sub_fetch(&t->refs, 1, SC) == 0) {
    free(t->payload);
    free(t);
  }
}

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
  PfbRing replies;        /* consumer: the reply thread only */
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
  /* Guards `pending` and `in_flight`: taken by callers and the reply thread. */
  pthread_mutex_t calls;
  PfbDispatchCall* pending;
  uint32_t in_flight;
  uint64_t posted;        /* CALLs posted to this attachment (guarded by `post`) */
  /* Guards `back`: result blocks to hand back with the next message. */
  pthread_mutex_t back_lock;
  Words back;
  /* Input blocks in this worker's hands (guarded by the dispatcher's arena
   * lock): freed when it hands them back, or when it is lost. */
  Words inputs;
} Worker;

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
  int closed;        /* atomic */
  uint32_t room_waiters;  /* atomic: submits waiting for room (see alloc_blocks) */
  uint32_t active;   /* atomic: submits under way (delete waits for them) */
  uint32_t refs;     /* atomic: see dispatch.h, Lifetime */
  PfbDispatchCounts counts;  /* atomic fields */
};

/* ------------------------------------------------------------- helpers -- */

static uint64_t wall_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void bump(uint64_t* field, int64_t delta) { __atomic_add_fetch(field, delta, SC); }

static int counting_on = 1;  /* pfb_dispatch_set_counting */
static uint64_t next_call_id;  /* atomic: every dispatcher's calls */

static void complete(PfbDispatchCall* call, uint32_t state) {
  __atomic_store_n(&call->state, state, SC);
  /* The caller is in this process: a private futex. */
  pfb_futex_wake(&call->state, INT_MAX, FUTEX_WAKE_PRIVATE);
}

/* Frees input blocks the worker handed back (or held when it was lost). */
static void free_inputs(PfbDispatch* d, Worker* w, const uint64_t* offsets, size_t n,
                        int all) {
  pthread_mutex_lock(&d->arena_lock);
  if (all) {
    for (size_t i = 0; i < w->inputs.count; ++i) pfb_arena_free(d->arena, w->inputs.items[i]);
    bump(&d->counts.input_blocks, -(int64_t)w->inputs.count);
    w->inputs.count = 0;
  } else {
    for (size_t i = 0; i < n; ++i) {
      /* Only a block this worker holds: a bogus hand-back changes nothing. */
      if (words_remove(&w->inputs, offsets[i]) && pfb_arena_free(d->arena, offsets[i]) == 0)
        bump(&d->counts.input_blocks, -1);
    }
  }
  pthread_cond_broadcast(&d->room);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Calls `back(context, offset)` for each result block of a DONE (its
 * records' blocks, or its error's). */
static void each_result_block(const PfbPoolSlot* message, void (*back)(void*, uint64_t),
                              void* context) {
  const PfbPoolMessage* m = &message[0].message;
  if (m->status != PFB_POOL_STATUS_OK) {
    if (m->block_size) back(context, m->block_offset);
    return;
  }
  uint32_t cursor = 1;
  PfbPoolTensor record;
  int64_t dims[PFB_POOL_MAX_NDIM];
  for (uint32_t i = 0; i < m->count; ++i) {
    if (pfb_msg_read_tensor(message, &cursor, &record, dims) != 0) break;
    if (record.size) back(context, record.offset);
  }
}

static void push_back(void* worker, uint64_t offset) {
  words_push(&((Worker*)worker)->back, offset);
}

/* Notes the result blocks of a DONE nobody takes, to hand them back. */
static void give_back_results(Worker* w, const PfbPoolSlot* message) {
  pthread_mutex_lock(&w->back_lock);
  each_result_block(message, push_back, w);
  pthread_mutex_unlock(&w->back_lock);
}

static void arena_back(void* arena, uint64_t offset) {
  pfb_dispatch_arena_back((PfbDispatchArena*)arena, offset);
}

void pfb_dispatch_reply_back(PfbDispatchCall* call) {
  if (call->reply != NULL && call->arena != NULL)
    each_result_block(call->reply, arena_back, call->arena);
}

/* ------------------------------------------------------- reply threads -- */

static void on_done(Worker* w, const PfbPoolSlot* message, uint32_t slots) {
  uint64_t id = message[0].message.call_id;
  PfbDispatchCall* call = NULL;
  pthread_mutex_lock(&w->calls);
  for (PfbDispatchCall** link = &w->pending; *link != NULL; link = &(*link)->next) {
    if ((*link)->id == id) {
      call = *link;
      *link = call->next;
      __atomic_sub_fetch(&w->in_flight, 1, SC);
      break;
    }
  }
  pthread_mutex_unlock(&w->calls);
  if (__atomic_load_n(&w->d->room_waiters, SC) != 0) {
    /* A submit waiting for room waits only while calls are in flight
     * (alloc_blocks): it looks again. */
    pthread_mutex_lock(&w->d->arena_lock);
    pthread_cond_broadcast(&w->d->room);
    pthread_mutex_unlock(&w->d->arena_lock);
  }
  PfbPoolSlot* copy = call ? (PfbPoolSlot*)malloc(slots * sizeof(PfbPoolSlot)) : NULL;
  if (copy == NULL) {  /* abandoned (or no memory): its blocks go back */
    give_back_results(w, message);
    if (call != NULL) {
      call->error = strdup("pyfunc_bridge: no memory for a pool call's reply");
      call->error_code = 8; /* RESOURCE_EXHAUSTED */
      complete(call, PFB_DISPATCH_FAILED);
    }
    return;
  }
  memcpy(copy, message, slots * sizeof(PfbPoolSlot));
  call->reply = copy;
  call->reply_slots = slots;
  pfb_dispatch_arena_keep(w->arena);
  call->arena = w->arena;
  complete(call, PFB_DISPATCH_DONE);
}

static void* reply_thread(void* arg) {
  Worker* w = (Worker*)arg;
  PfbPoolSlot* buffer =
      (PfbPoolSlot*)malloc(PFB_POOL_MAX_MESSAGE_SLOTS * sizeof(PfbPoolSlot));
  if (buffer == NULL) return NULL;
  for (;;) {
    uint64_t slept = w->replies.sleeps;
    int rc = pfb_ring_wait_items(&w->replies, -1, PFB_RING_CHECKS);
    bump(&w->d->counts.reply_sleeps, (int64_t)(w->replies.sleeps - slept));
    if (rc != 0) break;  /* EPIPE: closed and drained */
    int n;
    while ((n = pfb_ring_read(&w->replies, buffer, PFB_POOL_MAX_MESSAGE_SLOTS)) > 0) {
      const PfbPoolMessage* m = &buffer[0].message;
      if (m->kind == PFB_POOL_MSG_DONE) {
        on_done(w, buffer, (uint32_t)n);
      } else if (m->kind == PFB_POOL_MSG_INPUTS_BACK) {
        uint64_t offsets[64];
        size_t k = 0;
        for (uint32_t i = 0; i < m->count; ++i) {
          if (pfb_msg_read_word(buffer, i, &offsets[k]) != 0) break;  /* malformed: the rest */
          if (++k == 64) {
            free_inputs(w->d, w, offsets, k, 0);
            k = 0;
          }
        }
        if (k) free_inputs(w->d, w, offsets, k, 0);
      }
    }
    if (n < 0) break;  /* a malformed message: Python ends the worker when its socket ends */
  }
  free(buffer);
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
  for (int i = 0; i < workers; ++i) {
    Worker* w = &d->workers[i];
    w->d = d;
    w->index = i;
    w->doorbell = -1;
    pthread_mutex_init(&w->post, NULL);
    pthread_mutex_init(&w->calls, NULL);
    pthread_mutex_init(&w->back_lock, NULL);
  }
  return d;
}

int pfb_dispatch_attach(PfbDispatch* d, int index, PfbPoolControl* control, int doorbell,
                        const char* result_base, uint64_t result_bytes, uint64_t generation) {
  if (index < 0 || index >= d->workers_count) return EINVAL;
  Worker* w = &d->workers[index];
  pthread_mutex_lock(&w->post);
  if (w->attached || w->has_thread) {
    pthread_mutex_unlock(&w->post);
    return EBUSY;  /* lost() first */
  }
  if (w->scratch == NULL)
    w->scratch = (PfbPoolSlot*)malloc(PFB_POOL_MAX_MESSAGE_SLOTS * sizeof(PfbPoolSlot));
  if (w->scratch == NULL) {
    pthread_mutex_unlock(&w->post);
    return ENOMEM;
  }
  PfbDispatchArena* arena = (PfbDispatchArena*)calloc(1, sizeof(PfbDispatchArena));
  /* Old size 0 on a shared mapping: a second mapping of the same pages. */
  void* mapped = arena && result_bytes
                     ? mremap((void*)result_base, 0, result_bytes, MREMAP_MAYMOVE)
                     : NULL;
  if (arena == NULL || (result_bytes && mapped == MAP_FAILED)) {
    int err = arena == NULL ? ENOMEM : errno;
    free(arena);
    pthread_mutex_unlock(&w->post);
    return err;
  }
  arena->refs = 1;  /* the attachment's */
  arena->d = d;
  pfb_dispatch_retain(d);
  arena->index = index;
  arena->generation = generation;
  arena->base = (char*)mapped;
  arena->bytes = result_bytes;
  /* A descriptor of its own, closed by lost(): Python may close its own
   * while a submit still rings this one. */
  int bell = dup(doorbell);
  if (bell < 0) {
    int err = errno;
    pthread_mutex_unlock(&w->post);
    return err;
  }
  w->doorbell = bell;
  pfb_ring_attach(&w->requests, &control->requests, pfb_pool_request_slots(control),
                  control->ring_slots);
  pfb_ring_set_doorbell(&w->requests, bell);
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
  int rc = pthread_create(&w->thread, NULL, reply_thread, w);
  if (rc == 0) {
    w->has_thread = 1;
    __atomic_store_n(&w->attached, 1, SC);
  } else {
    w->arena = NULL;
    pfb_dispatch_arena_drop(arena);
    close(w->doorbell);
    w->doorbell = -1;
  }
  pthread_mutex_unlock(&w->post);
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
  /* The worker is dead (Python reaped it): what it counted is final.  It
   * starts CALLs in the order they were posted, so those posted after the
   * last one it started never ran. */
  uint64_t started = resend && w->control != NULL
                         ? __atomic_load_n(&w->control->ring_calls_started, SC)
                         : UINT64_MAX;
  pthread_mutex_lock(&w->calls);
  PfbDispatchCall* failed = w->pending;
  w->pending = NULL;
  __atomic_store_n(&w->in_flight, 0, SC);
  pthread_mutex_unlock(&w->calls);
  while (failed != NULL) {
    PfbDispatchCall* next = failed->next;
    if (failed->sequence > started) {
      bump(&d->counts.resent, 1);
      complete(failed, PFB_DISPATCH_RESEND);  /* its blocks go below: it is sent anew */
    } else {
      failed->error = strdup(message ? message : "pyfunc_bridge: the worker ended");
      failed->error_code = code;
      complete(failed, PFB_DISPATCH_FAILED);
    }
    failed = next;
  }
  free_inputs(d, w, NULL, 0, 1);  /* it holds nothing any more */
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
  for (int i = 0; i < d->workers_count; ++i)
    pfb_dispatch_lost(d, i, 1 /* CANCELLED */, "pyfunc_bridge: the pool was closed", 0);
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

/* The last reference: every worker was lost (delete), no route or arena
 * refers to it any more. */
static void destroy(PfbDispatch* d) {
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    free(w->known.items);
    free(w->forget.items);
    free(w->back.items);
    free(w->inputs.items);
    free(w->scratch);
    pthread_mutex_destroy(&w->post);
    pthread_mutex_destroy(&w->calls);
    pthread_mutex_destroy(&w->back_lock);
  }
  for (Token* t = d->tokens; t != NULL;) {
    Token* next = t->next;
    token_drop(t);
    t = next;
  }
  pfb_arena_delete(d->arena);
  if (d->input_base != NULL) munmap(d->input_base, d->input_bytes);
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
  if (find_token(d, token) != NULL) {  /* registered already: the first stays */
    pthread_mutex_unlock(&d->tokens_lock);
    free(copy);
    free(t);
    return 0;
  }
  t->next = d->tokens;
  d->tokens = t;
  pthread_mutex_unlock(&d->tokens_lock);
  return 0;
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

int pfb_dispatch_knows(PfbDispatch* d, uint64_t token) {
  pthread_mutex_lock(&d->tokens_lock);
  int found = find_token(d, token) != NULL;
  pthread_mutex_unlock(&d->tokens_lock);
  return found;
}

/* -------------------------------------------------------------- submit -- */

/* Whether any worker has native calls in flight (whose inputs may come
 * back). */
static int native_in_flight(PfbDispatch* d) {
  for (int i = 0; i < d->workers_count; ++i)
    if (__atomic_load_n(&d->workers[i].in_flight, SC) != 0) return 1;
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
     * their calls.  With no native call in flight, the room there is now
     * is all there will be (functions keep the rest; the Python path's
     * calls are its own to judge, as _process.py _alloc does): the call
     * goes to the Python path at once rather than after the timeout. */
    /* Counted before in_flight is read (on_done lowers in_flight, then
     * reads this): either this sees the DONE, or its reply thread sees
     * this waiter and wakes it. */
    __atomic_add_fetch(&d->room_waiters, 1, SC);
    int rc = !native_in_flight(d) ? ENOSPC
             : deadline >= 0 && pfb_now_ns() >= deadline ? ETIMEDOUT : 0;
    if (rc != 0) {
      __atomic_sub_fetch(&d->room_waiters, 1, SC);
      pthread_mutex_unlock(&d->arena_lock);
      return rc;
    }
    if (deadline >= 0) {
      int64_t at = deadline;
      struct timespec limit = {(time_t)(at / 1000000000), (long)(at % 1000000000)};
      pthread_cond_timedwait(&d->room, &d->arena_lock, &limit);
    } else {
      pthread_cond_wait(&d->room, &d->arena_lock);
    }
    __atomic_sub_fetch(&d->room_waiters, 1, SC);
  }
}

static void release_blocks(PfbDispatch* d, const uint64_t* sizes, const uint64_t* offsets,
                           uint32_t count) {
  pthread_mutex_lock(&d->arena_lock);
  for (uint32_t i = 0; i < count; ++i) {
    if (sizes[i] && pfb_arena_free(d->arena, offsets[i]) == 0)
      bump(&d->counts.input_blocks, -1);
  }
  pthread_cond_broadcast(&d->room);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Hands the blocks to worker `w` (they are its own until INPUTS_BACK). */
static void hand_blocks(PfbDispatch* d, Worker* w, const uint64_t* sizes,
                        const uint64_t* offsets, uint32_t count) {
  pthread_mutex_lock(&d->arena_lock);
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i]) words_push(&w->inputs, offsets[i]);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Posts one built message (w->scratch) on w's request ring; `post` held. */
static int post_scratch(Worker* w, int64_t deadline) {
  uint32_t slots = w->scratch[0].message.slots;
  int64_t left = deadline < 0 ? -1 : deadline - pfb_now_ns();
  if (deadline >= 0 && left < 0) left = 0;
  uint64_t rung = w->requests.wakes;
  /* (A wait for room rings a sleeping worker first: the hand-backs that
   * post_back left there may fill its ring.) */
  int rc = pfb_ring_wait_room(&w->requests, slots, left);
  bump(&w->d->counts.doorbells, (int64_t)(w->requests.wakes - rung));
  if (rc != 0) return rc;
  return pfb_ring_write(&w->requests, w->scratch);
}

/* Posts `list` as `kind` messages of words, as many as the ring takes now,
 * and keeps the rest for next time; `post` held. */
static void post_words(Worker* w, uint16_t kind, Words* list) {
  uint32_t per = PFB_POOL_WORDS_PER_SLOT *
                 (w->requests.capacity > 64 ? 63 : w->requests.capacity - 1);
  size_t sent = 0;
  while (sent < list->count) {
    pfb_msg_init(w->scratch, kind);
    size_t k = 0;
    for (; k < per && sent + k < list->count; ++k)
      pfb_msg_add_word(w->scratch, PFB_POOL_MAX_MESSAGE_SLOTS, list->items[sent + k]);
    if (pfb_ring_write(&w->requests, w->scratch) != 0) break;  /* no room now */
    sent += k;
  }
  memmove(list->items, list->items + sent, (list->count - sent) * sizeof(uint64_t));
  list->count -= sent;
}

/* Posts the tokens to forget, then the result blocks waiting to go back
 * to `w`; `post` held.  What has no room now goes next time. */
static void post_back(Worker* w) {
  post_words(w, PFB_POOL_MSG_FORGET, &w->forget);
  pthread_mutex_lock(&w->back_lock);
  post_words(w, PFB_POOL_MSG_RESULTS_BACK, &w->back);
  pthread_mutex_unlock(&w->back_lock);
}

void pfb_dispatch_flush(PfbDispatch* d, int index) {
  if (index < 0 || index >= d->workers_count || __atomic_load_n(&d->closed, SC)) return;
  Worker* w = &d->workers[index];
  pthread_mutex_lock(&w->back_lock);
  int waiting = w->back.count != 0;
  pthread_mutex_unlock(&w->back_lock);
  /* (`forget` is guarded by `post`: a stale look only sends it next time) */
  if (!waiting && __atomic_load_n(&w->forget.count, __ATOMIC_RELAXED) == 0) return;
  /* Busy: a producer is posting, and takes them (or the next one will).
   * Never waited for: a producer may hold it while it waits for room on
   * the ring, which may wait for the caller (a reader thread) here. */
  if (pthread_mutex_trylock(&w->post) != 0) return;
  if (w->attached) {
    post_back(w);
    uint64_t rung = w->requests.wakes;
    pfb_ring_notify(&w->requests);  /* rings only a worker that sleeps */
    bump(&d->counts.doorbells, (int64_t)(w->requests.wakes - rung));
  }
  pthread_mutex_unlock(&w->post);
}

/* A worker whose call has run this long is passed over while another one
 * is not so held: calls queued on its ring would wait behind a function
 * that may never return (the pool's Python path keeps such calls in its
 * queue instead).  Long next to a call's round trip (~50 us), short next
 * to what a stuck call costs the calls behind it. */
#define LONG_CALL_NS 20000000

/* The worker with the fewest calls in flight, among those not held by a
 * long call (any call, ring or socket: the worker shows it in its control
 * segment) if there is one. */
static Worker* choose(PfbDispatch* d) {
  Worker* best = NULL;
  int best_long = 1;
  uint32_t fewest = UINT32_MAX;
  int64_t now = pfb_now_ns();
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    if (!__atomic_load_n(&w->attached, SC)) continue;
    uint32_t n = __atomic_load_n(&w->in_flight, __ATOMIC_RELAXED);
    uint64_t running = __atomic_load_n(&w->control->running_call, __ATOMIC_ACQUIRE);
    uint64_t since = __atomic_load_n(&w->control->running_since, __ATOMIC_RELAXED);
    int held = running != 0 && since != 0 && now - (int64_t)since > LONG_CALL_NS;
    if ((!held && best_long) || (held == best_long && n < fewest)) {
      fewest = n;
      best = w;
      best_long = held;
    }
  }
  return best;
}

static int submit(PfbDispatch* d, uint64_t token, uint32_t flags,
                  const PfbDispatchInput* inputs, uint32_t count, int64_t timeout_ns,
                  PfbDispatchCall* call) {
  int64_t deadline = timeout_ns < 0 ? -1 : pfb_now_ns() + timeout_ns;
  if (count > PFB_POOL_MAX_MESSAGE_SLOTS) return E2BIG;
  pthread_mutex_lock(&d->tokens_lock);
  Token* fn = find_token(d, token);
  if (fn != NULL) __atomic_add_fetch(&fn->refs, 1, SC);  /* a forget meanwhile: LOADed still */
  pthread_mutex_unlock(&d->tokens_lock);
  if (fn == NULL) return ENOENT;
  uint64_t sizes_small[16], offsets_small[16];
  uint64_t* sizes = count <= 16 ? sizes_small : (uint64_t*)malloc(count * sizeof(uint64_t));
  uint64_t* offsets = count <= 16 ? offsets_small : (uint64_t*)malloc(count * sizeof(uint64_t));
  int rc = 0;
  if (sizes == NULL || offsets == NULL) {
    rc = ENOMEM;
    goto out;
  }
  /* An input pulled over the socket has no block (shm_layout.h). */
  for (uint32_t i = 0; i < count; ++i)
    sizes[i] = inputs[i].flags & PFB_POOL_TENSOR_SOCKET ? 0 : inputs[i].nbytes;
  rc = alloc_blocks(d, sizes, count, offsets, deadline);
  if (rc != 0) goto out;
  /* The copy in: the one copy of a call's inputs, outside every lock. */
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i]) memcpy(d->input_base + offsets[i], inputs[i].data, sizes[i]);

  for (;;) {
    Worker* w = choose(d);
    if (w == NULL) {
      release_blocks(d, sizes, offsets, count);
      rc = EAGAIN;
      goto out;
    }
    pthread_mutex_lock(&w->post);
    if (!w->attached) {  /* lost meanwhile: another one */
      pthread_mutex_unlock(&w->post);
      continue;
    }
    post_back(w);
    if (!words_has(&w->known, token)) {
      uint64_t load_size = fn->size, load_offset = 0;
      rc = alloc_blocks(d, &load_size, 1, &load_offset, deadline);
      uint32_t load_flags = 0;
      if (rc == ENOSPC || rc == E2BIG) {  /* no room: the worker pulls it (shm_layout.h) */
        load_size = load_offset = 0;
        load_flags = PFB_POOL_LOAD_SOCKET;
        rc = 0;
      }
      if (rc == 0) {
        if (load_size) memcpy(d->input_base + load_offset, fn->payload, load_size);
        pfb_msg_init(w->scratch, PFB_POOL_MSG_LOAD);
        w->scratch[0].message.flags = load_flags;
        w->scratch[0].message.token = token;
        w->scratch[0].message.block_offset = load_offset;
        w->scratch[0].message.block_size = load_size;
        rc = post_scratch(w, deadline);
        if (rc == 0) {
          hand_blocks(d, w, &load_size, &load_offset, 1);
          words_push(&w->known, token);
          bump(&d->counts.loads, 1);
        } else {
          release_blocks(d, &load_size, &load_offset, 1);
        }
      }
      if (rc != 0) {
        pthread_mutex_unlock(&w->post);
        release_blocks(d, sizes, offsets, count);
        goto out;
      }
    }
    pfb_msg_init(w->scratch, PFB_POOL_MSG_CALL);
    PfbPoolMessage* m = &w->scratch[0].message;
    /* Unique in the process: a DONE's answer that went by the socket is
     * found by its id alone (_process.py, native_reply). */
    call->id = __atomic_add_fetch(&next_call_id, 1, SC);
    m->call_id = call->id;
    m->token = token;
    m->flags = flags;
    m->stamp = wall_ns();
    for (uint32_t i = 0; i < count && rc == 0; ++i) {
      PfbPoolTensor record;
      memset(&record, 0, sizeof(record));
      record.code = inputs[i].code;
      record.bits = inputs[i].bits;
      record.lanes = inputs[i].lanes;
      record.flags = inputs[i].flags;
      record.ndim = inputs[i].ndim;
      record.offset = inputs[i].flags & PFB_POOL_TENSOR_SOCKET ? inputs[i].nbytes : offsets[i];
      record.size = sizes[i];
      rc = pfb_msg_add_tensor(w->scratch, PFB_POOL_MAX_MESSAGE_SLOTS, &record, inputs[i].dims);
    }
    if (rc == 0 && m->slots > w->requests.capacity) rc = E2BIG;
    if (rc == 0) {
      call->worker = w->index;
      call->generation = w->generation;
      call->sequence = ++w->posted;
      call->state = PFB_DISPATCH_WAITING;
      /* Listed before it is posted: its DONE may come at once. */
      pthread_mutex_lock(&w->calls);
      call->next = w->pending;
      w->pending = call;
      __atomic_add_fetch(&w->in_flight, 1, SC);
      pthread_mutex_unlock(&w->calls);
      rc = post_scratch(w, deadline);
      if (rc == 0) {
        hand_blocks(d, w, sizes, offsets, count);
      } else {
        pthread_mutex_lock(&w->calls);
        for (PfbDispatchCall** link = &w->pending; *link != NULL; link = &(*link)->next) {
          if (*link == call) {
            *link = call->next;
            __atomic_sub_fetch(&w->in_flight, 1, SC);
            break;
          }
        }
        pthread_mutex_unlock(&w->calls);
        --w->posted;  /* never posted */
      }
    }
    if (rc == 0) {
      uint64_t rung = w->requests.wakes;
      pfb_ring_notify(&w->requests);  /* rings only a worker that sleeps */
      bump(&d->counts.doorbells, (int64_t)(w->requests.wakes - rung));
      bump(&d->counts.calls, 1);
    }
    pthread_mutex_unlock(&w->post);
    if (rc != 0) release_blocks(d, sizes, offsets, count);
    break;
  }
out:
  if (sizes != sizes_small) free(sizes);
  if (offsets != offsets_small) free(offsets);
  token_drop(fn);
  return rc;
}

int pfb_dispatch_submit(PfbDispatch* d, uint64_t token, uint32_t flags,
                        const PfbDispatchInput* inputs, uint32_t count, int64_t timeout_ns,
                        PfbDispatchCall* call) {
  memset(call, 0, sizeof(*call));
  call->worker = -1;
  /* Counted first, then `closed` checked: delete sets `closed`, then waits
   * for the count, so no submit touches the input mapping once it goes. */
  __atomic_add_fetch(&d->active, 1, SC);
  int rc = __atomic_load_n(&d->closed, SC)
               ? EPIPE
               : submit(d, token, flags, inputs, count, timeout_ns, call);
  __atomic_sub_fetch(&d->active, 1, SC);
  return rc;
}

int pfb_dispatch_wait(PfbDispatchCall* call, int64_t timeout_ns) {
  int64_t deadline = timeout_ns < 0 ? -1 : pfb_now_ns() + timeout_ns;
  for (;;) {
    uint32_t state = __atomic_load_n(&call->state, SC);
    if (state != PFB_DISPATCH_WAITING) return 0;
    int64_t left = -1;
    if (deadline >= 0) {
      left = deadline - pfb_now_ns();
      if (left <= 0) return ETIMEDOUT;
    }
    pfb_futex_wait(&call->state, PFB_DISPATCH_WAITING, left, FUTEX_WAIT_PRIVATE);
  }
}

void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call) {
  if (call->worker >= 0 && __atomic_load_n(&call->state, SC) == PFB_DISPATCH_WAITING) {
    Worker* w = &d->workers[call->worker];
    int found = 0;
    pthread_mutex_lock(&w->calls);
    for (PfbDispatchCall** link = &w->pending; *link != NULL; link = &(*link)->next) {
      if (*link == call) {
        *link = call->next;
        __atomic_sub_fetch(&w->in_flight, 1, SC);
        found = 1;
        break;
      }
    }
    pthread_mutex_unlock(&w->calls);
    /* Not found: completed meanwhile (the reply thread unlinks first, then
     * publishes the state): wait for the state, then free as done. */
    if (!found) pfb_dispatch_wait(call, -1);
  }
  free(call->reply);
  free(call->error);
  pfb_dispatch_arena_drop(call->arena);
  call->reply = NULL;
  call->error = NULL;
  call->arena = NULL;
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

void pfb_dispatch_arena_back(PfbDispatchArena* arena, uint64_t offset) {
  Worker* w = &arena->d->workers[arena->index];
  pthread_mutex_lock(&w->back_lock);
  /* Only to the worker that wrote it (lost() clears w->arena under this
   * lock): a later worker in the slot has an arena of its own. */
  if (w->arena == arena) words_push(&w->back, offset);  /* (no memory: the block stays lost) */
  pthread_mutex_unlock(&w->back_lock);
}

int pfb_dispatch_alloc(PfbDispatch* d, uint64_t nbytes, uint64_t* offset, uint64_t* size) {
  pthread_mutex_lock(&d->arena_lock);
  int rc = pfb_arena_alloc(d->arena, nbytes, offset, size);
  pthread_mutex_unlock(&d->arena_lock);
  return rc;
}

int pfb_dispatch_free(PfbDispatch* d, uint64_t offset) {
  pthread_mutex_lock(&d->arena_lock);
  int rc = pfb_arena_free(d->arena, offset);
  pthread_cond_broadcast(&d->room);
  pthread_mutex_unlock(&d->arena_lock);
  return rc;
}

uint64_t pfb_dispatch_free_bytes(PfbDispatch* d) {
  pthread_mutex_lock(&d->arena_lock);
  uint64_t n = pfb_arena_free_bytes(d->arena);
  pthread_mutex_unlock(&d->arena_lock);
  return n;
}

/* -------------------------------------------------------------- routes -- */

PfbDispatchRoute* pfb_dispatch_route_new(PfbDispatch* d, uint64_t token, uint32_t flags) {
  PfbDispatchRoute* route = (PfbDispatchRoute*)calloc(1, sizeof(PfbDispatchRoute));
  if (route == NULL) return NULL;
  route->refs = 1;
  route->api = pfb_dispatch_api();
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

static const PfbDispatchApi api = {
    pfb_dispatch_submit,     pfb_dispatch_wait,       pfb_dispatch_finish,
    pfb_msg_read_tensor,     pfb_dispatch_arena_keep, pfb_dispatch_arena_drop,
    pfb_dispatch_arena_back, pfb_dispatch_route_keep, pfb_dispatch_route_drop,
    pfb_dispatch_reply_back};

const PfbDispatchApi* pfb_dispatch_api(void) { return &api; }

void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out) {
  out->calls = __atomic_load_n(&d->counts.calls, SC);
  out->loads = __atomic_load_n(&d->counts.loads, SC);
  out->doorbells = __atomic_load_n(&d->counts.doorbells, SC);
  out->reply_sleeps = __atomic_load_n(&d->counts.reply_sleeps, SC);
  out->input_blocks = __atomic_load_n(&d->counts.input_blocks, SC);
  out->resent = __atomic_load_n(&d->counts.resent, SC);
}
