/* The waits of src/pool's C files (the rings, the dispatcher): futexes and
 * the clock their timeouts count on.  Static inline: each file that
 * includes it gets its own copies, nothing is exported. */
#ifndef PYFUNC_BRIDGE_POOL_FUTEX_H_
#define PYFUNC_BRIDGE_POOL_FUTEX_H_

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* `clock`'s time in ns: CLOCK_REALTIME is time.time_ns() (TraceMe's clock,
 * the DONE's stamps), CLOCK_MONOTONIC time.monotonic_ns(), in any process. */
static inline int64_t pfb_clock_ns(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* CLOCK_MONOTONIC: every timeout's clock. */
static inline int64_t pfb_now_ns(void) { return pfb_clock_ns(CLOCK_MONOTONIC); }

/* The deadline of a wait of `timeout_ns` (negative: no limit, -1)... */
static inline int64_t pfb_deadline_ns(int64_t timeout_ns) {
  return timeout_ns < 0 ? -1 : pfb_now_ns() + timeout_ns;
}

/* ... and the time left before it: -1 for none, 0 once it passed. */
static inline int64_t pfb_left_ns(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - pfb_now_ns();
  return left > 0 ? left : 0;
}

/* `ns` as a timespec in `t`: `t`, or NULL for a negative `ns` (no limit). */
static inline struct timespec* pfb_timespec(int64_t ns, struct timespec* t) {
  if (ns < 0) return NULL;
  t->tv_sec = (time_t)(ns / 1000000000);
  t->tv_nsec = (long)(ns % 1000000000);
  return t;
}

/* Sleeps while *word == expected, at most `ns` (negative: no limit).  `op`:
 * FUTEX_WAIT when the waker is another process (a ring's words in shared
 * memory), FUTEX_WAIT_PRIVATE when it is this one.  EINTR, EAGAIN (the
 * word changed first) and ETIMEDOUT all send the caller back to its checks. */
static inline void pfb_futex_wait(uint32_t* word, uint32_t expected, int64_t ns, int op) {
  struct timespec t;
  syscall(SYS_futex, word, op, expected, pfb_timespec(ns, &t), NULL, 0);
}

/* As pfb_futex_wait, for a sleeper of `bitset` (FUTEX_WAIT_BITSET, whose
 * limit is absolute: CLOCK_MONOTONIC), on a shared word. */
static inline void pfb_futex_wait_bitset(uint32_t* word, uint32_t expected, int64_t ns,
                                         uint32_t bitset) {
  struct timespec t;
  syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, pfb_timespec(pfb_deadline_ns(ns), &t),
          NULL, bitset);
}

/* Wakes every sleeper of `word` whose bitset meets `bitset`. */
static inline void pfb_futex_wake_bitset(uint32_t* word, uint32_t bitset) {
  syscall(SYS_futex, word, FUTEX_WAKE_BITSET, INT32_MAX, NULL, NULL, bitset);
}

/* Wakes up to `waiters` sleepers on `word`; `op`: FUTEX_WAKE or
 * FUTEX_WAKE_PRIVATE, as the wait. */
static inline void pfb_futex_wake(uint32_t* word, int waiters, int op) {
  syscall(SYS_futex, word, op, waiters, NULL, NULL, 0);
}

#endif /* PYFUNC_BRIDGE_POOL_FUTEX_H_ */
