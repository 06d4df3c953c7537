# The one declaration of reply_decode.h, the decoder of a DONE.
from libc.stdint cimport int64_t, uint32_t, uint64_t

from includes.shm_layout cimport PfbPoolSlot, PfbPoolTensor

cdef extern from "reply_decode.h" nogil:
    ctypedef struct PfbReplyResult:
        PfbPoolTensor record
        int64_t dims[64]
        uint64_t nbytes
        int saves_copy
        uint64_t worker_copied

    int pfb_reply_decode(const PfbPoolSlot* message, uint64_t arena_bytes, PfbReplyResult* out,
                         uint32_t room, uint32_t* decoded)
