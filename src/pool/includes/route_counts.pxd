# The one declaration of route_counts.h, a route's counting rules (shared
# with the kernel's native calls, src/kernel/pool_route.cc).
from libc.stdint cimport int64_t, uint64_t

from includes.dispatch cimport PfbDispatchRouteCounts
from includes.shm_layout cimport PfbPoolMessage

cdef extern from "route_counts.h" nogil:
    void pfb_route_add(uint64_t* counter, uint64_t value)
    bint pfb_route_counting(const int* flag)
    void pfb_route_count_answered(PfbDispatchRouteCounts* counts, const PfbPoolMessage* done,
                                  int64_t posted, uint64_t bytes_in, uint64_t strings_in,
                                  uint64_t worker_in)
    void pfb_route_count_failed(PfbDispatchRouteCounts* counts)
