# The one declaration of dispatch.h, the parent's native side of the rings.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from includes.shm_layout cimport PfbPoolControl, PfbPoolSlot

cdef extern from "dispatch.h" nogil:
    ctypedef struct PfbDispatch

    ctypedef struct PfbDispatchArena:
        int index
        char* base
        uint64_t bytes

    ctypedef struct PfbDispatchInput:
        const void* data
        uint64_t nbytes
        uint8_t code
        uint8_t bits
        uint16_t lanes
        uint32_t flags
        int32_t ndim
        const int64_t* dims

    enum:
        PFB_DISPATCH_DONE
        PFB_DISPATCH_FAILED

    ctypedef struct PfbDispatchCall:
        uint32_t state
        uint64_t id
        int worker
        PfbPoolSlot* reply
        char* error
        int32_t error_code
        PfbDispatchArena* arena

    ctypedef struct PfbDispatchCounts:
        uint64_t calls
        uint64_t loads
        uint64_t reply_sleeps
        uint64_t caller_reads
        uint64_t input_blocks
        uint64_t queued

    ctypedef struct PfbDispatchRouteCounts:
        uint64_t calls
        uint64_t replied
        uint64_t errors
        uint64_t failed
        uint64_t bytes_in
        uint64_t bytes_out
        uint64_t shared_out
        uint64_t copied_out
        uint64_t copies_saved
        uint64_t queued_ns
        uint64_t worker_ns
        uint64_t total_ns
        uint64_t worker_copied
        uint64_t strings_in
        uint64_t worker_in

    ctypedef struct PfbDispatchRoute:
        PfbDispatch* d
        uint64_t token
        uint32_t flags
        const int* counting
        PfbDispatchRouteCounts counts

    PfbDispatch* pfb_dispatch_new(char* input_base, uint64_t input_bytes, int workers)
    void pfb_dispatch_delete(PfbDispatch* d)
    void pfb_dispatch_disown(PfbDispatch* d)
    void pfb_dispatch_forget(PfbDispatch* d, uint64_t token)
    void pfb_dispatch_arena_keep(PfbDispatchArena* arena)
    void pfb_dispatch_arena_drop(PfbDispatchArena* arena)
    void pfb_dispatch_arena_hand_back(PfbDispatchArena* arena, uint64_t offset)
    void pfb_dispatch_reply_hand_back(PfbDispatchCall* call)
    PfbDispatchRoute* pfb_dispatch_route_new(PfbDispatch* d, uint64_t token, uint32_t flags)
    void pfb_dispatch_route_keep(PfbDispatchRoute* route)
    void pfb_dispatch_route_drop(PfbDispatchRoute* route)
    void pfb_dispatch_set_counting(int on)
    int pfb_dispatch_counting()
    int pfb_dispatch_attach(PfbDispatch* d, int index, PfbPoolControl* control, int doorbell,
                            const char* result_base, uint64_t result_bytes, uint64_t generation)
    void pfb_dispatch_lost(PfbDispatch* d, int index, int32_t code, const char* message,
                           int resend)
    int pfb_dispatch_register(PfbDispatch* d, uint64_t token, const void* payload, uint64_t size)
    int pfb_dispatch_call(PfbDispatch* d, uint64_t token, uint32_t flags,
                          const PfbDispatchInput* inputs, uint32_t count, int64_t room_ns,
                          int64_t wait_ns, PfbDispatchCall* call)
    void pfb_dispatch_finish(PfbDispatch* d, PfbDispatchCall* call)
    void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out)
    uint64_t pfb_dispatch_free_bytes(PfbDispatch* d)
    bint pfb_dispatch_fits(PfbDispatch* d, const PfbDispatchInput* inputs, uint32_t count)
