/* The dispatcher's submit path: tokens, input blocks, submit, and a
 * caller's wait, abandon and finish (dispatch.h). */
#include <string.h>
#include <time.h>

#include "dispatch_internal.h"
#include "futex.h"

static uint64_t next_call_id;  /* atomic: every dispatcher's calls */

/* -------------------------------------------------------------- tokens -- */

/* The link to the function of `token` (*link NULL: none); `tokens_lock` held. */
static Token** find_token(PfbDispatch* d, uint64_t token) {
  Token** link = &d->tokens;
  while (*link != NULL && (*link)->token != token) link = &(*link)->next;
  return link;
}

int pfb_dispatch_register(PfbDispatch* d, uint64_t token, const void* payload, uint64_t size) {
  Token* t = (Token*)calloc(1, sizeof(Token) + size);
  if (t == NULL) return ENOMEM;
  memcpy(t->payload, payload, size);
  t->refs = 1;  /* the registry's */
  t->token = token;
  t->size = size;
  pthread_mutex_lock(&d->tokens_lock);
  /* Registered already: the first stays.  Closed: delete dropped the
   * functions, and nothing would drop this one. */
  int closed = __atomic_load_n(&d->closed, SC);
  int known = closed || *find_token(d, token) != NULL;
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
  Token** link = find_token(d, token);
  Token* t = *link;
  if (t != NULL) *link = t->next;
  pthread_mutex_unlock(&d->tokens_lock);
  if (t != NULL) token_drop(t);  /* the registry's reference */
  for (int i = 0; i < d->workers_count; ++i) {
    Worker* w = &d->workers[i];
    pthread_mutex_lock(&w->post);
    if (words_remove(&w->known, token)) words_push(&w->forget, token);
    pthread_mutex_unlock(&w->post);
  }
}

/* -------------------------------------------------------- input blocks -- */

/* Frees input blocks and wakes the callers waiting for room: those of
 * `offsets` whose `sizes` are not 0 (NULL: all); with `held` (a worker's
 * hand-back), only those it holds, taken out of it: a bogus hand-back
 * changes nothing. */
void pfb_disp_free_blocks(PfbDispatch* d, Words* held, const uint64_t* sizes,
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

/* Blocks for `count` sizes (0: no block, offset 0), all or none: 0, or
 * ENOMEM with none taken; `arena_lock` held. */
static int alloc_all(PfbDispatch* d, const uint64_t* sizes, uint32_t count, uint64_t* offsets) {
  uint64_t size;
  for (uint32_t got = 0; got < count; ++got) {
    offsets[got] = 0;
    if (sizes[got] && pfb_arena_alloc(d->arena, sizes[got], &offsets[got], &size) != 0) {
      while (got-- > 0)
        if (sizes[got]) pfb_arena_free(d->arena, offsets[got]);
      return ENOMEM;
    }
  }
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i]) bump(&d->counts.input_blocks, 1);
  return 0;
}

/* Blocks for `count` sizes, all or none, waiting for room until `deadline`
 * (negative: none) while native calls are in flight; ENOSPC when none is.
 * Sizes of 0 get no block (offset 0). */
int pfb_disp_alloc_blocks(PfbDispatch* d, const uint64_t* sizes, uint32_t count,
                          uint64_t* offsets, int64_t deadline) {
  for (uint32_t i = 0; i < count; ++i)
    if (sizes[i] > d->input_bytes) return E2BIG;
  int rc;
  pthread_mutex_lock(&d->arena_lock);
  for (;;) {
    rc = __atomic_load_n(&d->closed, SC) ? EPIPE : alloc_all(d, sizes, count, offsets);
    if (rc != ENOMEM) break;
    /* Inputs come back as workers let go of them (INPUTS_BACK), after
     * their calls.  With no call in flight, the room there is now is all
     * there will be (functions keep the rest): the caller hears ENOSPC at
     * once rather than after the timeout, and pulls inputs instead
     * (input_records.h, pfb_input_transport). */
    /* Counted before `outstanding` is read (on_done lowers it, then reads
     * this): either this sees the DONE, or its reply thread sees this
     * waiter and wakes it. */
    __atomic_add_fetch(&d->room_waiters, 1, SC);
    /* In flight: CALLs posted and not answered, whose inputs come back
     * after them (queued calls hold their blocks until a post). */
    int in_flight = 0;
    for (int i = 0; i < d->workers_count; ++i)
      in_flight |= __atomic_load_n(&d->workers[i].outstanding, SC) != 0;
    rc = !in_flight ? ENOSPC : pfb_left_ns(deadline) == 0 ? ETIMEDOUT : 0;
    struct timespec limit;
    if (rc == 0 && deadline >= 0)
      pthread_cond_timedwait(&d->room, &d->arena_lock, pfb_timespec(deadline, &limit));
    else if (rc == 0)
      pthread_cond_wait(&d->room, &d->arena_lock);
    __atomic_sub_fetch(&d->room_waiters, 1, SC);
    if (rc != 0) break;
  }
  pthread_mutex_unlock(&d->arena_lock);
  return rc;
}

/* -------------------------------------------------------------- submit -- */

/* The slots of a CALL of these inputs, its header included. */
static uint64_t call_slots(const PfbDispatchInput* inputs, uint32_t count) {
  uint64_t slots = 1;
  for (uint32_t i = 0; i < count; ++i) slots += pfb_pool_tensor_slots(inputs[i].ndim);
  return slots;
}

int pfb_dispatch_fits(PfbDispatch* d, const PfbDispatchInput* inputs, uint32_t count) {
  return pfb_pool_message_fits(call_slots(inputs, count), __atomic_load_n(&d->ring_slots, SC));
}

/* A node for a call of `inputs`, taking the caller's reference on `fn`:
 * its `sizes` set (an input pulled over the socket has no block,
 * shm_layout.h), its `offsets` for the caller to allocate, its CALL for
 * fill.  One allocation: the node, its message (`slots`), then `sizes`
 * and `offsets`.  NULL: no memory. */
static Queued* queued_new(Token* fn, const PfbDispatchInput* inputs, uint32_t count,
                          uint32_t slots, PfbDispatchCall* call) {
  Queued* q = (Queued*)malloc(sizeof(Queued) + (size_t)slots * sizeof(PfbPoolSlot) +
                              2 * (size_t)count * sizeof(uint64_t));
  if (q == NULL) return NULL;
  q->next = NULL;
  q->call = call;
  q->fn = fn;
  q->count = count;
  q->sizes = (uint64_t*)(q->message + slots);
  q->offsets = q->sizes + count;
  for (uint32_t i = 0; i < count; ++i)
    q->sizes[i] = inputs[i].flags & PFB_POOL_TENSOR_SOCKET ? 0 : inputs[i].nbytes;
  return q;
}

/* Copies the inputs into q's blocks, the one copy of a call's inputs,
 * outside every lock, and builds q's CALL (`slots` long) over them. */
static void fill(PfbDispatch* d, Queued* q, uint32_t flags, const PfbDispatchInput* inputs,
                 uint32_t slots) {
  pfb_msg_init(q->message, PFB_POOL_MSG_CALL);
  PfbPoolMessage* m = &q->message[0].message;
  m->call_id = q->call->id;
  m->token = q->fn->token;
  m->flags = flags;
  for (uint32_t i = 0; i < q->count; ++i) {
    const PfbDispatchInput* in = &inputs[i];
    if (q->sizes[i]) memcpy(d->input_base + q->offsets[i], in->data, q->sizes[i]);
    /* A pulled input has no block: its record names the payload (shm_layout.h). */
    uint64_t offset = in->flags & PFB_POOL_TENSOR_SOCKET ? in->nbytes : q->offsets[i];
    PfbPoolTensor record = {in->code, in->bits, in->lanes, in->ndim, in->flags, 0,
                            offset, q->sizes[i], {0}};
    pfb_msg_add_tensor(q->message, slots, &record, in->dims);  /* sized to fit */
  }
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
  Token* fn = *find_token(d, token);
  if (fn != NULL) __atomic_add_fetch(&fn->refs, 1, SC);  /* a forget meanwhile: LOADed still */
  pthread_mutex_unlock(&d->tokens_lock);
  if (fn == NULL) return ENOENT;
  Queued* q = queued_new(fn, inputs, count, slots, call);
  if (q == NULL) {
    token_drop(fn);
    return ENOMEM;
  }
  int rc = pfb_disp_alloc_blocks(d, q->sizes, count, q->offsets, deadline);
  if (rc != 0) {
    pfb_disp_queued_free(d, q, 0);
    return rc;
  }
  /* Unique in the process: a DONE's answer that went by the socket is
   * found by its id alone (pyfunc_bridge/pool/answers.py, decode_answer). */
  call->id = __atomic_add_fetch(&next_call_id, 1, SC);
  fill(d, q, flags, inputs, slots);
  /* Every call joins the queue (its blocks the queue's now), behind the
   * calls that wait: first come, first posted. */
  pthread_mutex_lock(&d->queue_lock);
  rc = __atomic_load_n(&d->closed, SC) ? EPIPE : d->attached_count == 0 ? EAGAIN : 0;
  if (rc == 0) pfb_disp_queue_push(d, q, 0);
  pthread_mutex_unlock(&d->queue_lock);
  if (rc != 0) {
    pfb_disp_queued_free(d, q, 1);
    return rc;
  }
  bump(&d->counts.calls, 1);
  /* Then posted by this thread to workers with credit, as far as it goes;
   * what stays queued the reply threads post as DONEs come. */
  for (int tries = 0; tries < 4 * d->workers_count + 4; ++tries) {
    Worker* w = pfb_disp_choose(d);
    if (w == NULL) break;
    pthread_mutex_lock(&w->post);
    int own_rc = 0, waits = 0;
    if (w->attached) waits = pfb_disp_pump(d, w, deadline, call, &own_rc);
    pfb_disp_post_unlock(w);
    if (own_rc != 0) {
      rc = own_rc;
      break;
    }
    /* (Read without the queue's lock: only this thread takes its own call
     * out of the queue, so a stale count never hides it.) */
    int done = __atomic_load_n(&call->worker, SC) >= 0 ||
               __atomic_load_n(&d->counts.queued, SC) == 0;
    if (done || waits) break;
  }
  return rc;
}

int pfb_dispatch_abandon(PfbDispatch* d, PfbDispatchCall* call) {
  if (call->id == 0 || __atomic_load_n(&call->state, SC) != PFB_DISPATCH_WAITING) return 0;
  /* Out of the queue (its blocks back: no worker saw it), or off its
   * worker's list (its results go back when its DONE comes); found in
   * neither, it was completed meanwhile (whoever ends a call unlists it
   * first, then publishes the state). */
  pthread_mutex_lock(&d->queue_lock);
  int worker = call->worker;
  Queued* q = worker < 0 ? pfb_disp_queue_remove(d, call) : NULL;
  pthread_mutex_unlock(&d->queue_lock);
  if (q != NULL)
    pfb_disp_queued_free(d, q, 1);
  else if (worker < 0 || pfb_disp_unlist(&d->workers[worker], call, 0) == NULL)
    return 0;
  call->id = 0;  /* nothing left for finish to end */
  return 1;
}

void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call) {
  if (call->id != 0 && __atomic_load_n(&call->state, SC) == PFB_DISPATCH_WAITING &&
      !pfb_dispatch_abandon(d, call)) {
    /* Completed meanwhile: wait for the state; its result blocks go back,
     * as an abandoned call's do. */
    pfb_dispatch_wait(call, -1);
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

int pfb_dispatch_post(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      PfbDispatchCall* call, void (*on_end)(PfbDispatchCall*, void*),
                      void* arg) {
  PfbDispatchCall made = {.state = PFB_DISPATCH_WAITING, .d = d, .worker = -1,
                          .on_end = on_end, .on_end_arg = arg};  /* the rest zero */
  *call = made;
  /* Counted first, then `closed` checked: delete sets `closed`, then waits
   * for the count, so no submit touches the input mapping once it goes. */
  __atomic_add_fetch(&d->active, 1, SC);
  int rc = __atomic_load_n(&d->closed, SC)
               ? EPIPE
               : submit(d, token, flags, inputs, count, room_ns, call);
  __atomic_sub_fetch(&d->active, 1, SC);
  if (rc != 0) call->id = 0;  /* not submitted: nothing for finish to end */
  return rc;
}

int pfb_dispatch_call(PfbDispatch* d, uint64_t token, uint32_t flags,
                      const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                      int64_t wait_ns, PfbDispatchCall* call) {
  for (;;) {
    if (call->id == 0) {  /* not submitted yet, or resent: posted, woken by its end */
      int rc = pfb_dispatch_post(d, token, flags, inputs, count, room_ns, call, NULL, NULL);
      if (rc != 0) return rc;
    }
    int rc = pfb_dispatch_wait(call, wait_ns);
    if (rc != 0 || call->state != PFB_DISPATCH_RESEND) return rc;
    /* Its worker died before it started the call: the function never ran,
     * so it is submitted again (while no worker is attached: EAGAIN). */
    pfb_dispatch_finish(d, call);
  }
}
