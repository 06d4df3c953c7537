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

/* CLOCK_MONOTONIC ns (time.monotonic_ns() in any process of this machine). */
static inline int64_t pfb_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Sleeps while *word == expected, at most `ns` (negative: no limit).  `op`:
 * FUTEX_WAIT when the waker is another process (a ring's words in shared
 * memory), FUTEX_WAIT_PRIVATE when it is this one.  EINTR, EAGAIN (the
 * word changed first) and ETIMEDOUT all send the caller back to its checks. */
static inline void pfb_futex_wait(uint32_t* word, uint32_t expected, int64_t ns, int op) {
  struct timespec timeout;
  struct timespec* limit = NULL;
  if (ns >= 0) {
    timeout.tv_sec = (time_t)(ns / 1000000000);
    timeout.tv_nsec = (long)(ns % 1000000000);
    limit = &timeout;
  }
  syscall(SYS_futex, word, op, expected, limit, NULL, 0);
}

/* As pfb_futex_wait, for a sleeper of `bitset` (FUTEX_WAIT_BITSET, whose
 * limit is absolute: CLOCK_MONOTONIC), on a shared word. */
static inline void pfb_futex_wait_bitset(uint32_t* word, uint32_t expected, int64_t ns,
                                         uint32_t bitset) {
  struct timespec at;
  struct timespec* limit = NULL;
  if (ns >= 0) {
    int64_t deadline = pfb_now_ns() + ns;
    at.tv_sec = (time_t)(deadline / 1000000000);
    at.tv_nsec = (long)(deadline % 1000000000);
    limit = &at;
  }
  syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, limit, NULL, bitset);
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
