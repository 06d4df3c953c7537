/* The dispatcher's reply threads, and the callers that read a worker's
 * reply ring themselves: DONEs complete calls (dispatch.h). */
#include <limits.h>
#include <string.h>

#include "dispatch_internal.h"
#include "futex.h"

/* A reply thread whose worker has credit while calls wait (a post that
 * found no room: the ring, the arena for a LOAD) looks again this often;
 * otherwise it sleeps until a message comes. */
#define RETRY_NS 1000000

/* ---------------------------------------------------------------- ends -- */

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
  if (call != own)
    pfb_futex_wake(&call->state, INT_MAX, FUTEX_PRIVATE_FLAG, FUTEX_BITSET_MATCH_ANY);
  if (on_end != NULL) on_end(call, arg);
}

/* Ends a call no DONE answers: RESEND (its function never ran: its caller
 * submits it again), or FAILED with (`code`, `message`). */
void pfb_disp_end_call(PfbDispatchCall* call, int resend, int32_t code, const char* message,
                       const PfbDispatchCall* own) {
  if (!resend) {
    call->error = strdup(message);
    call->error_code = code;
  }
  complete(call, resend ? PFB_DISPATCH_RESEND : PFB_DISPATCH_FAILED, own);
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
PfbDispatchCall* pfb_disp_unlist(Worker* w, const PfbDispatchCall* call, uint64_t id) {
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
  PfbDispatchCall* call = pfb_disp_unlist(w, NULL, message[0].message.call_id);
  /* A credit back (abandoned or not, the worker is done with it): the
   * queue's next call goes to this worker before its caller wakes, so that
   * the worker works meanwhile. */
  pthread_mutex_lock(&w->d->queue_lock);
  if (w->outstanding) __atomic_sub_fetch(&w->outstanding, 1, SC);
  pthread_mutex_unlock(&w->d->queue_lock);
  if (pfb_disp_queue_waits(w)) pfb_disp_pump_async(w);
  if (__atomic_load_n(&w->d->room_waiters, SC) != 0) {
    /* A submit waiting for room waits only while calls are in flight
     * (pfb_disp_alloc_blocks): it looks again. */
    pthread_mutex_lock(&w->d->arena_lock);
    pthread_cond_broadcast(&w->d->room);
    pthread_mutex_unlock(&w->d->arena_lock);
  }
  PfbPoolSlot* copy = call ? (PfbPoolSlot*)malloc(slots * sizeof(PfbPoolSlot)) : NULL;
  if (copy == NULL) {  /* abandoned (or no memory): its blocks go back */
    hand_back_results(w->arena, message);
    if (call != NULL)
      pfb_disp_end_call(call, 0, 8 /* RESOURCE_EXHAUSTED */,
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
 * malformed message: the peer broke the protocol, so the role retires
 * (nobody reads a broken ring) and Python ends the worker when its socket
 * ends. */
static int drain(Worker* w, const PfbDispatchCall* own) {
  PfbPoolSlot* buffer = w->scratch + PFB_POOL_MAX_MESSAGE_SLOTS;  /* the reader's half */
  int n;
  while ((n = pfb_ring_read(&w->replies, buffer, PFB_POOL_MAX_MESSAGE_SLOTS)) > 0) {
    const PfbPoolMessage* m = &buffer[0].message;
    if (m->kind == PFB_POOL_MSG_DONE) {
      on_done(w, buffer, (uint32_t)n, own);
    } else if (m->kind == PFB_POOL_MSG_INPUTS_BACK) {
      /* Its words lie in order from slot 1 on (PfbPoolWords); a count
       * past its slots is cut to them (malformed: the rest). */
      uint64_t held = ((uint64_t)n - 1) * PFB_POOL_WORDS_PER_SLOT;
      pfb_disp_free_blocks(w->d, &w->inputs, NULL, (const uint64_t*)(buffer + 1),
                           m->count < held ? m->count : held);
    }
  }
  if (n < 0) __atomic_store_n(&w->role, ROLE_RETIRED, SC);
  return n < 0 ? -1 : 0;
}

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
  if (pfb_ring_available(&w->replies) || pfb_disp_queue_waits(w))
    pfb_ring_wake(&w->replies, PFB_POOL_SLEEPER_READER);
}

/* The reply thread sleeps unless it can read now (or must end). */
static int reader_ready(void* worker) {
  Worker* w = (Worker*)worker;
  uint32_t role = __atomic_load_n(&w->role, SC);
  return role == ROLE_RETIRED || (role == ROLE_FREE && pfb_ring_available(&w->replies));
}

void* pfb_disp_reply_thread(void* arg) {
  Worker* w = (Worker*)arg;
  for (;;) {
    /* Calls wait and this worker could take one: posted now; a post that
     * had to wait (no room) is tried again after RETRY_NS. */
    int64_t timeout = -1;
    if (pfb_disp_queue_waits(w)) {
      pfb_disp_pump_async(w);
      if (pfb_disp_queue_waits(w)) timeout = RETRY_NS;
    }
    if (role_take(w) && drain(w, NULL) == 0) role_give(w);
    if (__atomic_load_n(&w->role, SC) == ROLE_RETIRED) break;  /* lost, or a broken ring */
    /* Closed: ends once drained, or at once while a caller reads (it
     * drains what is left). */
    if (pfb_ring_closed(&w->replies) && !reader_ready(w)) break;
    /* Given up while it sleeps: a waiting caller may read meanwhile. */
    if (pfb_ring_sleep(&w->replies, PFB_POOL_SLEEPER_READER, timeout, reader_ready, w))
      bump(&w->d->counts.reply_sleeps, 1);
  }
  return NULL;
}

/* --------------------------------------------------- callers that read -- */

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
 * (pfb_disp_pump).  0, or ETIMEDOUT. */
static int read_for(Worker* w, PfbDispatchCall* call, int64_t deadline) {
  Reading reading = {w, call};
  for (;;) {
    if (drain(w, call) != 0) return 0;
    if (__atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING ||
        __atomic_load_n(&call->worker, SC) != w->index || pfb_ring_closed(&w->replies))
      return 0;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    pfb_ring_sleep(&w->replies, PFB_POOL_SLEEPER_CALLER, left, caller_ready, &reading);
  }
}

/* Sleeps until the call is DONE, FAILED or RESEND (0; at once for a call
 * not submitted), or `timeout_ns` passed (ETIMEDOUT; negative: no limit),
 * reading its worker's reply ring itself while it holds the reader role
 * (docs/pool.md, "A kernel's native call", step 5). */
int pfb_dispatch_wait(PfbDispatchCall* call, int64_t timeout_ns) {
  int64_t deadline = pfb_deadline_ns(timeout_ns);
  int tried = 0;
  for (;;) {
    if (call->id == 0 || __atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING) return 0;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    /* Posted, and nobody reads its worker's ring: this caller does. */
    int index = __atomic_load_n(&call->worker, SC);
    if (!tried && index >= 0 && index < call->d->workers_count) {
      Worker* w = &call->d->workers[index];
      tried = 1;  /* once per wake-up: a look each time round would spin */
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
        continue;
      }
      /* The reply thread (or another caller) reads: it completes this one. */
    }
    pfb_futex_wait(&call->state, PFB_DISPATCH_WAITING, left, FUTEX_PRIVATE_FLAG,
                   FUTEX_BITSET_MATCH_ANY);
    tried = 0;
  }
}
