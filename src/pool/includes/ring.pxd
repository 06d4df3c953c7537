# The one declaration of ring.h, the control segment's rings.
from libc.stdint cimport int64_t, uint32_t, uint64_t

from includes.shm_layout cimport PfbPoolRingWords, PfbPoolSlot

cdef extern from "ring.h" nogil:
    enum:
        PFB_RING_CHECKS

    ctypedef struct PfbRing:
        PfbPoolRingWords* words
        PfbPoolSlot* slots
        uint32_t capacity
        int doorbell
        uint64_t wakes
        uint64_t sleeps

    void pfb_ring_attach(PfbRing* ring, PfbPoolRingWords* words, PfbPoolSlot* slots,
                         uint32_t capacity)
    uint32_t pfb_ring_room(const PfbRing* ring)
    int pfb_ring_wait_room(PfbRing* ring, uint32_t slots, int64_t timeout_ns)
    int pfb_ring_write(PfbRing* ring, const PfbPoolSlot* message)
    int pfb_ring_notify(PfbRing* ring)
    void pfb_ring_set_consumer_sleeping(PfbRing* ring, int sleeping)
    uint32_t pfb_ring_available(const PfbRing* ring)
    int pfb_ring_wait_items(PfbRing* ring, int64_t timeout_ns, uint32_t checks)
    int pfb_ring_read(PfbRing* ring, PfbPoolSlot* out, uint32_t max_slots)
    void pfb_ring_close(PfbRing* ring)
    int pfb_ring_closed(const PfbRing* ring)
    int pfb_ring_consumer_sleeping(const PfbRing* ring)
