/* A route's counters (PfbDispatchRouteCounts, dispatch.h): the rules by
 * which a call adds to them, once, for the kernel's native calls
 * (src/kernel/pool_route.cc) and the pool's Python path (route.pxi, Route.call).
 * Kernels' threads and Python add at once: every add is atomic (relaxed).
 *
 * Plain C that also compiles as C++. */
#ifndef PYFUNC_BRIDGE_POOL_ROUTE_COUNTS_H_
#define PYFUNC_BRIDGE_POOL_ROUTE_COUNTS_H_

#include <stdint.h>

#include "dispatch.h"

static inline void pfb_route_add(uint64_t* counter, uint64_t value) {
  __atomic_add_fetch(counter, value, __ATOMIC_RELAXED);
}

/* Whether statistics are on (PfbDispatchRoute.counting). */
static inline int pfb_route_counting(const int* flag) {
  return __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
}

/* A call its worker answered, returned or raised, by its DONE `done`,
 * posted at `posted` (ns, CLOCK_REALTIME: the clock of its stamps): the pool's figures (calls, its
 * inputs' `bytes_in`, time queued and in the worker), and the inputs' share
 * of the function's (`strings_in`, `worker_in`: zero where the caller
 * counts them with the function's figures, as the Python path does). */
static inline void pfb_route_count_answered(PfbDispatchRouteCounts* counts,
                                            const PfbPoolMessage* done, int64_t posted,
                                            uint64_t bytes_in, uint64_t strings_in,
                                            uint64_t worker_in) {
  pfb_route_add(&counts->calls, 1);
  pfb_route_add(&counts->bytes_in, bytes_in);
  pfb_route_add(&counts->strings_in, strings_in);
  pfb_route_add(&counts->worker_in, worker_in);
  if (done->stamp >= (uint64_t)posted) {
    pfb_route_add(&counts->queued_ns, done->stamp - (uint64_t)posted);
  }
  if (done->ended >= done->stamp) pfb_route_add(&counts->worker_ns, done->ended - done->stamp);
}

/* A call the pool failed (its worker died or was ended, or the pool closed
 * under it), on either path: the pool's calls_failed.  The kernel counts its
 * function's error beside it (`errors`); the Python path's caller does. */
static inline void pfb_route_count_failed(PfbDispatchRouteCounts* counts) {
  pfb_route_add(&counts->failed, 1);
}

#endif /* PYFUNC_BRIDGE_POOL_ROUTE_COUNTS_H_ */
