/* The dispatcher's lifetime: new, attach, lost, delete (dispatch.h). */
#define _GNU_SOURCE /* mremap, MREMAP_MAYMOVE */
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dispatch_internal.h"

/* ------------------------------------------------------------ lifetime -- */

PfbDispatch* pfb_dispatch_new(char* input_base, uint64_t input_bytes, int workers) {
  PfbDispatch* d = (PfbDispatch*)calloc(1, sizeof(PfbDispatch) + (size_t)workers * sizeof(Worker));
  if (d == NULL) return NULL;
  d->arena = pfb_arena_new(input_bytes);
  /* A mapping of its own of the input arena (as for result arenas): a
   * kernel's submit may copy into it while Python closes the pool and
   * unmaps its own. */
  void* mapped = input_bytes ? mremap(input_base, 0, input_bytes, MREMAP_MAYMOVE) : NULL;
  if (d->arena == NULL || mapped == MAP_FAILED) {
    if (mapped != NULL && mapped != MAP_FAILED) munmap(mapped, input_bytes);
    pfb_arena_delete(d->arena);
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
  d->queue_tail = &d->queue_head;
  for (int i = 0; i < workers; ++i) {
    Worker* w = &d->workers[i];
    w->d = d;
    w->index = i;
    w->requests.doorbell = -1;
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
  PfbDispatchArena made = {1, d, index, (char*)mapped, bytes};
  *arena = made;
  pfb_dispatch_retain(d);  /* the mapping's reference */
  return arena;
}

/* pfb_dispatch_attach, `post` held. */
static int attach(Worker* w, PfbPoolControl* control, int doorbell, const char* result_base,
                  uint64_t result_bytes, uint64_t generation) {
  if (w->attached) return EBUSY;  /* lost() first */
  if (w->scratch == NULL)  /* the producer's half, then the reader's */
    w->scratch = (PfbPoolSlot*)malloc(2 * PFB_POOL_MAX_MESSAGE_SLOTS * sizeof(PfbPoolSlot));
  if (w->scratch == NULL) return ENOMEM;
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
  pfb_ring_attach(&w->requests, &control->requests, pfb_pool_request_slots(control),
                  control->ring_slots);
  pfb_ring_attach(&w->replies, &control->replies, pfb_pool_reply_slots(control),
                  control->ring_slots);
  w->arena = arena;
  w->control = control;
  w->generation = generation;
  w->posted = 0;
  /* (`back` is empty: lost() emptied it, and with no arena none comes.) */
  w->known.count = 0;
  w->forget.count = 0;
  __atomic_store_n(&w->d->ring_slots, w->requests.capacity, SC);
  __atomic_store_n(&w->role, ROLE_FREE, SC);  /* the rings are bound: readable */
  int rc = pthread_create(&w->thread, NULL, pfb_disp_reply_thread, w);
  if (rc == 0) {
    w->requests.doorbell = bell;  /* (rung by producers, under `post`, which this holds) */
    __atomic_store_n(&w->attached, 1, SC);
    pthread_mutex_lock(&w->d->queue_lock);
    __atomic_store_n(&w->outstanding, 0, SC);
    ++w->d->attached_count;
    pthread_mutex_unlock(&w->d->queue_lock);
  } else {
    __atomic_store_n(&w->role, ROLE_RETIRED, SC);  /* no call was posted: nobody reads */
    w->arena = NULL;
    pfb_dispatch_arena_drop(arena);
    close(bell);
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
  pfb_disp_post_unlock(w);
  return rc;
}

void pfb_dispatch_lost(PfbDispatch* d, int index, int32_t code, const char* message,
                       int resend) {
  if (index < 0 || index >= d->workers_count) return;
  Worker* w = &d->workers[index];
  pthread_mutex_lock(&w->post);  /* no producer is under way */
  int joined = w->attached;  /* its reply thread to join, its place in attached_count */
  __atomic_store_n(&w->attached, 0, SC);
  pthread_t thread = w->thread;
  /* (No producer is under way, and none comes.) */
  if (w->requests.doorbell >= 0) close(w->requests.doorbell);
  w->requests.doorbell = -1;
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
  if (joined && --d->attached_count == 0) orphans = pfb_disp_queue_take(d);
  pthread_mutex_unlock(&d->queue_lock);
  pfb_disp_end_queued(d, orphans);
  pthread_mutex_lock(&w->calls);
  PfbDispatchCall* failed = w->pending;
  w->pending = NULL;
  pthread_mutex_unlock(&w->calls);
  while (failed != NULL) {
    PfbDispatchCall* next = failed->next;
    /* (A resent call's blocks go below with the rest: it is sent anew.) */
    pfb_disp_end_call(failed, failed->sequence > started, code,
                      message ? message : "pyfunc_bridge: the worker ended", NULL);
    failed = next;
  }
  /* It holds nothing any more (and nobody hands it blocks: no reader, no
   * producer is left). */
  pfb_disp_free_blocks(d, NULL, NULL, w->inputs.items, w->inputs.count);
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
   * now on, and no worker attaches.)  The queue goes with the last attached
   * worker's lost(): a call joins it, or goes back to it, only while a
   * worker is attached (queue_lock). */
  for (int i = 0; i < d->workers_count; ++i)
    pfb_dispatch_lost(d, i, FAILED_PRECONDITION, CLOSED_TEXT, 0);
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
    if (w->requests.doorbell >= 0) close(w->requests.doorbell);
    w->requests.doorbell = -1;
  }
}

void pfb_dispatch_retain(PfbDispatch* d) { __atomic_add_fetch(&d->refs, 1, SC); }

void pfb_dispatch_release(PfbDispatch* d) {
  if (d == NULL || __atomic_sub_fetch(&d->refs, 1, SC) != 0) return;
  /* The last reference: delete lost every worker, unmapped the inputs and
   * dropped the functions; no route or arena refers to it any more. */
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
  pfb_arena_delete(d->arena);
  pthread_mutex_destroy(&d->queue_lock);
  pthread_cond_destroy(&d->room);
  pthread_mutex_destroy(&d->arena_lock);
  pthread_mutex_destroy(&d->tokens_lock);
  free(d);
}
