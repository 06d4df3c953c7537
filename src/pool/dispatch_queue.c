/* The dispatcher's one scheduler: the pool queue, worker credits, and the
 * posts of queued calls on the request rings (dispatch.h). */
#include <string.h>
#include <time.h>

#include "dispatch_internal.h"
#include "futex.h"

/* Calls posted to one worker and not yet answered (its credits): one that
 * runs and the next one ready on its ring, so that a worker never waits
 * for the parent between calls, and a worker stuck in a slow call holds
 * one call more at most (the rest wait in the pool queue). */
#define CREDITS 2

/* A deadline that is already past: a post that would wait gives up at once
 * (a reply thread must never wait for its own worker). */
#define NOW 0

/* --------------------------------------------------------------- posts -- */

/* Posts one built message on w's request ring, waiting for room until
 * `deadline` (NOW: not at all); `post` held. */
static int post_message(Worker* w, const PfbPoolSlot* message, int64_t deadline) {
  /* (A wait for room rings a sleeping worker first: the hand-backs that
   * post_call posted first may fill its ring.) */
  int rc = pfb_ring_wait_room(&w->requests, message[0].message.slots, pfb_left_ns(deadline));
  return rc != 0 ? rc : pfb_ring_write(&w->requests, message);
}

/* Posts `list` as `kind` messages of words, as many as the ring takes now
 * while `keep` slots stay free, and keeps the rest for next time; `post`
 * held. */
static void post_words(Worker* w, uint16_t kind, Words* list, uint32_t keep) {
  uint32_t per = pfb_pool_words_per_message(w->requests.capacity);
  size_t sent = 0;
  while (sent < list->count) {
    pfb_msg_init(w->scratch, kind);
    size_t k = 0;
    for (; k < per && sent + k < list->count; ++k)
      pfb_msg_add_word(w->scratch, PFB_POOL_MAX_MESSAGE_SLOTS, list->items[sent + k]);
    if (pfb_ring_room(&w->requests) < w->scratch[0].message.slots + keep ||
        pfb_ring_write(&w->requests, w->scratch) != 0)
      break;  /* no room now */
    sent += k;
  }
  memmove(list->items, list->items + sent, (list->count - sent) * sizeof(uint64_t));
  list->count -= sent;
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
int pfb_disp_queue_waits(Worker* w) {
  return __atomic_load_n(&w->d->counts.queued, SC) != 0 && has_credit(w, pfb_now_ns());
}

/* The worker for the queue's next call: among those with credit, one not
 * held by a long call if there is one, then the fewest outstanding; NULL
 * when none has credit (a hint: the post rechecks under the locks). */
Worker* pfb_disp_choose(PfbDispatch* d) {
  Worker* best = NULL;
  uint32_t best_rank = UINT32_MAX;
  int64_t now = pfb_now_ns();
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    if (!has_credit(w, now)) continue;
    /* Held ones after all others; its outstanding calls are fewer than CREDITS. */
    uint32_t rank = (uint32_t)held(w, now) * CREDITS +
                    __atomic_load_n(&w->outstanding, __ATOMIC_RELAXED);
    if (rank < best_rank) {
      best_rank = rank;
      best = w;
    }
  }
  return best;
}

/* The queue's operations; `queue_lock` held.  `counts.queued` follows. */
void pfb_disp_queue_push(PfbDispatch* d, Queued* q, int front) {
  Queued** at = front ? &d->queue_head : d->queue_tail;
  q->next = *at;
  *at = q;
  if (d->queue_tail == at) d->queue_tail = &q->next;  /* the new last node */
  bump(&d->counts.queued, 1);
}

/* Takes the node of `call` out of the queue (NULL: not there). */
Queued* pfb_disp_queue_remove(PfbDispatch* d, PfbDispatchCall* call) {
  for (Queued** link = &d->queue_head; *link != NULL; link = &(*link)->next) {
    Queued* q = *link;
    if (q->call != call) continue;
    *link = q->next;
    if (d->queue_tail == &q->next) d->queue_tail = link;
    q->next = NULL;
    bump(&d->counts.queued, -1);
    return q;
  }
  return NULL;
}

/* Empties the queue: its nodes, as a list. */
Queued* pfb_disp_queue_take(PfbDispatch* d) {
  Queued* all = d->queue_head;
  d->queue_head = NULL;
  d->queue_tail = &d->queue_head;
  __atomic_store_n(&d->counts.queued, 0, SC);  /* (it counts the queue, under queue_lock) */
  return all;
}

/* Frees a node; with `release`, its blocks go back to the arena (a call
 * no worker got). */
void pfb_disp_queued_free(PfbDispatch* d, Queued* q, int release) {
  if (release) pfb_disp_free_blocks(d, NULL, q->sizes, q->offsets, q->count);
  token_drop(q->fn);
  free(q);
}

/* Ends the calls of `list`, which no worker got: FAILED once the
 * dispatcher is closed, otherwise RESEND (no worker is attached: the caller
 * submits again, gets EAGAIN, and the pool waits for the replacement,
 * ProcessPool.ring_call). */
void pfb_disp_end_queued(PfbDispatch* d, Queued* list) {
  int closed = __atomic_load_n(&d->closed, SC);
  while (list != NULL) {
    Queued* next = list->next;
    PfbDispatchCall* call = list->call;
    pfb_disp_queued_free(d, list, 1);
    pfb_disp_end_call(call, !closed, FAILED_PRECONDITION, CLOSED_TEXT, NULL);
    list = next;
  }
}

/* Hands the blocks (sizes not 0) to worker `w`: its own until INPUTS_BACK. */
static void hand_blocks(PfbDispatch* d, Worker* w, const uint64_t* sizes,
                        const uint64_t* offsets, uint32_t count) {
  pthread_mutex_lock(&d->arena_lock);
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i]) words_push(&w->inputs, offsets[i]);
  pthread_mutex_unlock(&d->arena_lock);
}

/* Posts q's LOAD (when w lacks its function) and its CALL, waiting for
 * room until `deadline` (NOW: no wait, and nothing posted unless both fit
 * now); `post` held.  0, or an errno: the CALL was not posted. */
static int post_call(PfbDispatch* d, Worker* w, Queued* q, int64_t deadline) {
  uint32_t slots = q->message[0].message.slots;
  if (!pfb_pool_message_fits(slots, w->requests.capacity)) return E2BIG;
  int load = words_find(&w->known, q->fn->token) < 0;
  uint32_t keep = slots + (uint32_t)load;  /* the CALL's slots, and its LOAD's */
  /* First the tokens to forget, then the result blocks waiting to go back
   * to `w`, while `keep` slots stay free; what has no room goes next time. */
  post_words(w, PFB_POOL_MSG_FORGET, &w->forget, keep);
  pthread_mutex_lock(&w->back_lock);
  post_words(w, PFB_POOL_MSG_RESULTS_BACK, &w->back, keep);
  pthread_mutex_unlock(&w->back_lock);
  if (deadline == NOW && pfb_ring_room(&w->requests) < keep) return EAGAIN;
  if (load) {
    uint64_t load_size = q->fn->size, load_offset = 0;
    int rc = pfb_disp_alloc_blocks(d, &load_size, 1, &load_offset, deadline);
    int pulled = rc == ENOSPC || rc == E2BIG;  /* no room: the worker pulls it (shm_layout.h) */
    if (rc != 0 && !pulled) return rc;
    if (pulled) load_size = load_offset = 0;
    if (load_size) memcpy(d->input_base + load_offset, q->fn->payload, load_size);
    pfb_msg_init(w->scratch, PFB_POOL_MSG_LOAD);
    PfbPoolMessage* m = &w->scratch[0].message;
    m->flags = pulled ? PFB_POOL_LOAD_SOCKET : 0;
    m->token = q->fn->token;
    m->block_offset = load_offset;
    m->block_size = load_size;
    rc = post_message(w, w->scratch, deadline);
    if (rc != 0) {
      pfb_disp_free_blocks(d, NULL, &load_size, &load_offset, 1);
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
int pfb_disp_pump(PfbDispatch* d, Worker* w, int64_t deadline, PfbDispatchCall* own,
                  int* own_rc) {
  int posted = 0, waits = 0;
  for (;;) {
    pthread_mutex_lock(&d->queue_lock);
    if (__atomic_load_n(&d->closed, SC) || d->queue_head == NULL ||
        !has_credit(w, pfb_now_ns())) {
      pthread_mutex_unlock(&d->queue_lock);
      break;
    }
    Queued* q = pfb_disp_queue_remove(d, d->queue_head->call);
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
      pfb_disp_queued_free(d, q, 0);
      posted = 1;
      continue;
    }
    /* Not posted: the list entry goes back, and the call waits again at
     * the front, unless it must not. */
    --w->posted;
    int again = rc == EAGAIN || rc == ETIMEDOUT || rc == EPIPE;
    pthread_mutex_lock(&d->queue_lock);
    int listed = pfb_disp_unlist(w, call, 0) != NULL;
    int requeued = listed && again && !__atomic_load_n(&d->closed, SC) &&
                   d->attached_count > 0;
    if (listed) {
      /* Not w's: a caller that reads w's ring for it stops (read_for). */
      __atomic_store_n(&call->worker, -1, SC);
      pfb_ring_wake(&w->replies, PFB_POOL_SLEEPER_CALLER);
    }
    if (requeued) pfb_disp_queue_push(d, q, 1);
    pthread_mutex_unlock(&d->queue_lock);
    if (requeued) {
      waits = rc;
      break;
    }
    if (listed && (call != own || again)) {
      pfb_disp_end_queued(d, q);  /* closed, or no worker left */
    } else {  /* abandoned meanwhile (nobody waits for it), or the submitter's */
      pfb_disp_queued_free(d, q, 1);
      if (listed) *own_rc = rc;
    }
  }
  if (posted) pfb_ring_notify(&w->requests);  /* (rings the worker only if it sleeps) */
  return waits;
}

/* Runs the posts asked for while `post` was busy; a post that must wait
 * is left to w's reply thread (RETRY_NS). */
void pfb_disp_pump_async(Worker* w) {
  __atomic_store_n(&w->wanted, 1, SC);
  while (__atomic_load_n(&w->wanted, SC) && pthread_mutex_trylock(&w->post) == 0) {
    __atomic_store_n(&w->wanted, 0, SC);
    if (w->attached) pfb_disp_pump(w->d, w, NOW, NULL, NULL);
    pthread_mutex_unlock(&w->post);
  }
}

/* Unlocks `post`; then runs what a reply thread asked for meanwhile. */
void pfb_disp_post_unlock(Worker* w) {
  pthread_mutex_unlock(&w->post);
  if (__atomic_load_n(&w->wanted, SC)) pfb_disp_pump_async(w);
}
