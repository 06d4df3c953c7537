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

/* A futex whose waker is another process (a ring's words in shared
 * memory); one whose waker is this process is FUTEX_PRIVATE_FLAG. */
#define PFB_FUTEX_SHARED 0

/* Sleeps while *word == expected, at most `ns` (negative: no limit), as a
 * sleeper of `bitset`: a wake naming one of its bits wakes it
 * (FUTEX_BITSET_MATCH_ANY: every wake does).  `kind`: PFB_FUTEX_SHARED or
 * FUTEX_PRIVATE_FLAG.  EINTR, EAGAIN (the word changed first) and ETIMEDOUT
 * all send the caller back to its checks. */
static inline void pfb_futex_wait(uint32_t* word, uint32_t expected, int64_t ns, int kind,
                                  uint32_t bitset) {
  struct timespec t;  /* (FUTEX_WAIT_BITSET's limit is absolute, on CLOCK_MONOTONIC) */
  syscall(SYS_futex, word, FUTEX_WAIT_BITSET | kind, expected,
          pfb_timespec(pfb_deadline_ns(ns), &t), NULL, bitset);
}

/* Wakes up to `waiters` sleepers of `word` whose bitset meets `bitset`;
 * `kind` as their wait's. */
static inline void pfb_futex_wake(uint32_t* word, int waiters, int kind, uint32_t bitset) {
  syscall(SYS_futex, word, FUTEX_WAKE_BITSET | kind, waiters, NULL, NULL, bitset);
}

#endif /* PYFUNC_BRIDGE_POOL_FUTEX_H_ */
