# The one declaration of input_records.h, a call's input records and their
# transport (shared with the kernel's native calls, src/kernel/pool_route.cc).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from includes.dispatch cimport PfbDispatchInput

cdef extern from "input_records.h" nogil:
    ctypedef struct PfbInputCounts:
        uint64_t bytes
        uint64_t string_bytes
        uint64_t to_worker

    ctypedef struct PfbBytes:
        const char* data
        uint64_t size

    enum:
        PFB_SEND_DECLINED
        PFB_SEND_AS_IS
        PFB_SEND_PACKED
        PFB_SEND_MOVED

    void pfb_input_numbers(PfbDispatchInput* item, const void* data, uint64_t nbytes,
                           uint8_t code, uint8_t bits, uint16_t lanes, int32_t ndim,
                           const int64_t* dims, uint32_t call_flags, PfbInputCounts* counts)
    char* pfb_input_strings(PfbDispatchInput* item, const PfbBytes* elements, uint64_t count,
                            int32_t ndim, const int64_t* dims, PfbInputCounts* counts)
    int pfb_input_transport(PfbDispatchInput* inputs, uint32_t count, int rc, int fits,
                            uint64_t room, int moves)
