/* One ring of a worker's control segment (shm_layout.h: "THE RINGS"), seen
 * from one process: one producer and one consumer (one thread at a time),
 * messages of whole slots, futex wake-ups only when the other side sleeps.
 *
 * A producer writes messages (pfb_ring_write, which publishes each) and then
 * calls pfb_ring_notify once for the batch.  A consumer waits
 * (pfb_ring_wait_items), then reads (pfb_ring_read) every message there is
 * before it waits again: one wake-up serves a batch.
 *
 * Plain C that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_RING_H_
#define PYFUNC_BRIDGE_POOL_RING_H_

#include <stdint.h>

#include "shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This process's handle of a ring (process-local: the pointers are this
 * process's addresses of the shared words and slots). */
typedef struct PfbRing {
  PfbPoolRingWords* words;
  PfbPoolSlot* slots;
  /* Slots, a power of two: this process's own copy, so that a peer that
   * scribbles over the control segment cannot send an index out of bounds. */
  uint32_t capacity;
  /* An eventfd this process writes to wake the consumer instead of the
   * futex (-1: the futex): set on the request ring in the parent, whose
   * worker waits on its socket and its ring at once (poll), which a futex
   * cannot join.  Process-local, like the pointers. */
  int doorbell;
  /* Counts of this process's side, for tests and statistics. */
  uint64_t wakes;   /* FUTEX_WAKE calls made */
  uint64_t sleeps;  /* FUTEX_WAIT calls made */
} PfbRing;

/* The default bounded check of a consumer before it sleeps: a few
 * microseconds at most, far from a spin (a core is a worker on 2 cores). */
#define PFB_RING_CHECKS 64

/* Binds a handle to a ring's words and slots (no change to shared memory).
 * A new ring's words are all zero: the parent zeroes the control segment
 * as it lays it out (Channel). */
void pfb_ring_attach(PfbRing* ring, PfbPoolRingWords* words, PfbPoolSlot* slots,
                     uint32_t capacity);

/* ---- the producer ---- */

/* Slots free for the producer now. */
uint32_t pfb_ring_room(const PfbRing* ring);
/* Waits until `slots` slots are free: 0; ETIMEDOUT after `timeout_ns`
 * (negative: no limit; 0: no wait); EPIPE when the ring is closed; EMSGSIZE
 * when a message of `slots` can never fit.  Before it sleeps it notifies
 * (pfb_ring_notify) for what was published since the last notify: only a
 * consumer that reads can make room. */
int pfb_ring_wait_room(PfbRing* ring, uint32_t slots, int64_t timeout_ns);
/* Copies one message (`message[0].message.slots` slots) into the ring and
 * publishes it, without waking the consumer: 0, or EAGAIN when there is no
 * room (nothing written), EPIPE when closed, EINVAL for a malformed header. */
int pfb_ring_write(PfbRing* ring, const PfbPoolSlot* message);
/* Wakes the consumer if it sleeps, once for everything published since:
 * 1 when a FUTEX_WAKE (or a doorbell write) was made, 0 when the consumer
 * was awake. */
int pfb_ring_notify(PfbRing* ring);

/* ---- the consumer ---- */

/* Slots published and not yet consumed. */
uint32_t pfb_ring_available(const PfbRing* ring);
/* Waits until a message is there: 0; ETIMEDOUT; EPIPE when the ring is
 * closed and empty.  Checks `checks` times before it sleeps. */
int pfb_ring_wait_items(PfbRing* ring, int64_t timeout_ns, uint32_t checks);
/* Copies the next message into `out` (at most `max_slots` slots) and gives
 * its slots back, waking a producer that waits for room: its slot count; 0
 * when the ring is empty; -EMSGSIZE when it is longer than `max_slots`
 * (left in the ring); -EPROTO when its header is malformed (the peer broke
 * the protocol: the caller ends the worker). */
int pfb_ring_read(PfbRing* ring, PfbPoolSlot* out, uint32_t max_slots);

/* The consumer's sleep (wait_items', and the parent's reply ring's, whose
 * consumer is one of several threads, dispatch_reply.c's reader role): announces
 * `sleeper` (PFB_POOL_SLEEPER_*) and sleeps, unless the ring is closed or
 * `ready(context)` (checked after the announcement), until a producer or
 * pfb_ring_wake wakes that sleeper, or `timeout_ns` (negative: no limit).
 * Reads nothing.  1 when it slept. */
int pfb_ring_sleep(PfbRing* ring, uint32_t sleeper, int64_t timeout_ns,
                   int (*ready)(void*), void* context);
/* Wakes the consumer's threads asleep as `sleeper`, if any: for a change
 * that their `ready` reads, made after it (sequentially consistent). */
void pfb_ring_wake(PfbRing* ring, uint32_t sleeper);

/* Sets (1) or clears (0) the consumer's sleeper flag (PFB_POOL_SLEEPER_READER), for a consumer that
 * sleeps elsewhere than in pfb_ring_wait_items (poll on a doorbell and a
 * socket).  After setting it, the consumer checks pfb_ring_available once
 * more before it sleeps (sequentially consistent, as in wait_items: either
 * it sees the message or the producer sees the flag and rings). */
void pfb_ring_set_consumer_sleeping(PfbRing* ring, int sleeping);

/* ---- both ---- */

/* Ends the ring: every wait on either side returns (EPIPE once drained). */
void pfb_ring_close(PfbRing* ring);
int pfb_ring_closed(const PfbRing* ring);
/* Whether the consumer has set its sleeper flag (tests, diagnostics). */
int pfb_ring_consumer_sleeping(const PfbRing* ring);

#ifdef __cplusplus
}
#endif

#endif /* PYFUNC_BRIDGE_POOL_RING_H_ */
