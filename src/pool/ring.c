/* The rings (ring.h).  Every access to a ring's shared words is atomic; the
 * stores and loads that decide whether to sleep or wake are sequentially
 * consistent (see shm_layout.h for why no wake-up is lost). */
#include "ring.h"

#include "futex.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#define LOAD(word, order) __atomic_load_n(&(word), order)
#define STORE(word, value, order) __atomic_store_n(&(word), value, order)
#define SC __ATOMIC_SEQ_CST

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void pfb_ring_attach(PfbRing* ring, PfbPoolRingWords* words, PfbPoolSlot* slots,
                     uint32_t capacity) {
  PfbRing made = {words, slots, capacity, -1, 0, 0};
  *ring = made;
}

void pfb_ring_set_consumer_sleeping(PfbRing* ring, int sleeping) {
  if (sleeping)
    __atomic_fetch_or(&ring->words->consumer_sleeping, PFB_POOL_SLEEPER_READER, SC);
  else
    __atomic_fetch_and(&ring->words->consumer_sleeping, ~(uint32_t)PFB_POOL_SLEEPER_READER, SC);
}

int pfb_ring_closed(const PfbRing* ring) { return LOAD(ring->words->closed, SC) != 0; }

int pfb_ring_consumer_sleeping(const PfbRing* ring) {
  return LOAD(ring->words->consumer_sleeping, SC) != 0;
}

void pfb_ring_close(PfbRing* ring) {
  PfbPoolRingWords* w = ring->words;
  STORE(w->closed, 1, SC);
  /* Both sides may sleep; the bump makes a wait that has not started yet
   * return at once. */
  __atomic_fetch_add(&w->items_wake, 1, SC);
  __atomic_fetch_add(&w->space_wake, 1, SC);
  pfb_futex_wake(&w->items_wake, INT_MAX, PFB_FUTEX_SHARED, FUTEX_BITSET_MATCH_ANY);
  pfb_futex_wake(&w->space_wake, INT_MAX, PFB_FUTEX_SHARED, FUTEX_BITSET_MATCH_ANY);
}

/* ------------------------------------------------------------ producer -- */

uint32_t pfb_ring_room(const PfbRing* ring) {
  uint64_t used = LOAD(ring->words->tail, __ATOMIC_RELAXED) - LOAD(ring->words->head, SC);
  return used >= ring->capacity ? 0 : (uint32_t)(ring->capacity - used);
}

int pfb_ring_wait_room(PfbRing* ring, uint32_t slots, int64_t timeout_ns) {
  PfbPoolRingWords* w = ring->words;
  if (slots > ring->capacity) return EMSGSIZE;
  int64_t deadline = pfb_deadline_ns(timeout_ns);
  for (;;) {
    if (pfb_ring_closed(ring)) return EPIPE;
    if (pfb_ring_room(ring) >= slots) return 0;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    /* A consumer asleep with messages it was never rung for (a batch not
     * notified yet) would never make the room this waits for. */
    pfb_ring_notify(ring);
    uint32_t seen = LOAD(w->space_wake, SC);
    STORE(w->producer_sleeping, 1, SC);
    if (pfb_ring_room(ring) < slots && !pfb_ring_closed(ring)) {
      ++ring->sleeps;
      pfb_futex_wait(&w->space_wake, seen, left, PFB_FUTEX_SHARED, FUTEX_BITSET_MATCH_ANY);
    }
    STORE(w->producer_sleeping, 0, SC);
  }
}

int pfb_ring_write(PfbRing* ring, const PfbPoolSlot* message) {
  uint32_t slots = message[0].message.slots;
  if (slots == 0 || slots > ring->capacity) return EINVAL;
  if (pfb_ring_closed(ring)) return EPIPE;
  if (pfb_ring_room(ring) < slots) return EAGAIN;
  PfbPoolRingWords* w = ring->words;
  uint64_t tail = LOAD(w->tail, __ATOMIC_RELAXED);  /* only this side writes it */
  uint32_t mask = ring->capacity - 1;
  for (uint32_t i = 0; i < slots; ++i)
    memcpy(&ring->slots[(tail + i) & mask], &message[i], sizeof(PfbPoolSlot));
  /* Publishes the slots written above (and orders this store before the
   * load of consumer_sleeping in pfb_ring_notify). */
  STORE(w->tail, tail + slots, SC);
  return 0;
}

int pfb_ring_notify(PfbRing* ring) {
  PfbPoolRingWords* w = ring->words;
  __atomic_thread_fence(SC);
  uint32_t sleepers = LOAD(w->consumer_sleeping, SC);
  if (!sleepers) return 0;
  if (ring->doorbell >= 0) {
    /* An eventfd keeps its count until read: a ring that comes before the
     * consumer's poll still wakes it.  EAGAIN (the count is full) means it
     * is rung already. */
    uint64_t one = 1;
    ssize_t unused = write(ring->doorbell, &one, sizeof(one));
    (void)unused;
  } else {
    /* A caller that holds the reader role reads everything there is: the
     * reply thread sleeps on (shm_layout.h). */
    pfb_ring_wake(ring, sleepers & PFB_POOL_SLEEPER_CALLER ? PFB_POOL_SLEEPER_CALLER
                                                           : PFB_POOL_SLEEPER_READER);
  }
  ++ring->wakes;
  return 1;
}

void pfb_ring_wake(PfbRing* ring, uint32_t sleeper) {
  PfbPoolRingWords* w = ring->words;
  if (!(LOAD(w->consumer_sleeping, SC) & sleeper)) return;
  __atomic_fetch_add(&w->items_wake, 1, SC);
  pfb_futex_wake(&w->items_wake, INT_MAX, PFB_FUTEX_SHARED, sleeper);
}

/* ------------------------------------------------------------ consumer -- */

uint32_t pfb_ring_available(const PfbRing* ring) {
  uint64_t n = LOAD(ring->words->tail, SC) - LOAD(ring->words->head, __ATOMIC_RELAXED);
  /* More than the ring holds: a scribbled tail; pfb_ring_read reports it. */
  return n > ring->capacity ? ring->capacity + 1 : (uint32_t)n;
}

static int has_items(void* ring) { return pfb_ring_available((PfbRing*)ring) != 0; }

int pfb_ring_wait_items(PfbRing* ring, int64_t timeout_ns, uint32_t checks) {
  for (uint32_t i = 0; i < checks; ++i) {
    if (pfb_ring_available(ring)) return 0;
    cpu_relax();
  }
  int64_t deadline = pfb_deadline_ns(timeout_ns);
  for (;;) {
    if (pfb_ring_available(ring)) return 0;
    if (pfb_ring_closed(ring)) return EPIPE;
    int64_t left = pfb_left_ns(deadline);
    if (left == 0) return ETIMEDOUT;
    ring->sleeps += pfb_ring_sleep(ring, PFB_POOL_SLEEPER_READER, left, has_items, ring);
  }
}

int pfb_ring_sleep(PfbRing* ring, uint32_t sleeper, int64_t timeout_ns,
                   int (*ready)(void*), void* context) {
  PfbPoolRingWords* w = ring->words;
  int slept = 0;
  uint32_t seen = LOAD(w->items_wake, SC);
  __atomic_fetch_or(&w->consumer_sleeping, sleeper, SC);
  /* Checked after the flag: whoever changes what `ready` reads (a producer
   * that publishes) either sees the flag (and wakes) or is seen here. */
  if (timeout_ns != 0 && !pfb_ring_closed(ring) && !ready(context)) {
    slept = 1;
    pfb_futex_wait(&w->items_wake, seen, timeout_ns, PFB_FUTEX_SHARED, sleeper);
  }
  __atomic_fetch_and(&w->consumer_sleeping, ~sleeper, SC);
  return slept;
}

int pfb_ring_read(PfbRing* ring, PfbPoolSlot* out, uint32_t max_slots) {
  PfbPoolRingWords* w = ring->words;
  uint32_t available = pfb_ring_available(ring);
  if (available == 0) return 0;
  if (available > ring->capacity) return -EPROTO;
  uint64_t head = LOAD(w->head, __ATOMIC_RELAXED);  /* only this side writes it */
  uint32_t mask = ring->capacity - 1;
  /* The header is read once, into `out`: the peer could change the shared
   * copy between a check and a use. */
  memcpy(&out[0], &ring->slots[head & mask], sizeof(PfbPoolSlot));
  uint32_t slots = out[0].message.slots;
  if (slots == 0 || slots > available) return -EPROTO;
  if (slots > max_slots) return -EMSGSIZE;
  for (uint32_t i = 1; i < slots; ++i)
    memcpy(&out[i], &ring->slots[(head + i) & mask], sizeof(PfbPoolSlot));
  /* Gives the slots back (and orders this store before the load of
   * producer_sleeping). */
  STORE(w->head, head + slots, SC);
  if (LOAD(w->producer_sleeping, SC)) {
    __atomic_fetch_add(&w->space_wake, 1, SC);
    pfb_futex_wake(&w->space_wake, 1, PFB_FUTEX_SHARED, FUTEX_BITSET_MATCH_ANY);
    ++ring->wakes;
  }
  return (int)slots;
}
