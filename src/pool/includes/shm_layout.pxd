# The one declaration of shm_layout.h, the pool's shared-memory layout.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "shm_layout.h" nogil:
    enum:
        PFB_POOL_MAGIC
        PFB_POOL_LAYOUT_VERSION
        PFB_POOL_ALIGN
        PFB_POOL_SLOT_BYTES
        PFB_POOL_MAX_NDIM
        PFB_POOL_INLINE_DIMS
        PFB_POOL_DIMS_PER_SLOT
        PFB_POOL_WORDS_PER_SLOT
        PFB_POOL_MSG_LOAD
        PFB_POOL_MSG_CALL
        PFB_POOL_MSG_RESULTS_BACK
        PFB_POOL_MSG_FORGET
        PFB_POOL_MSG_DONE
        PFB_POOL_MSG_INPUTS_BACK
        PFB_POOL_MSG_WORDS
        PFB_POOL_CALL_WRITABLE
        PFB_POOL_CALL_SCALARS
        PFB_POOL_CALL_TORCH
        PFB_POOL_CALL_JAX
        PFB_POOL_CALL_FACTS
        PFB_POOL_CALL_CUPY
        PFB_POOL_CALL_FRAMEWORKS
        PFB_POOL_CALL_PACKED
        PFB_POOL_LOAD_SOCKET
        PFB_POOL_DONE_ONE
        PFB_POOL_DONE_TUPLE
        PFB_POOL_DONE_LIST
        PFB_POOL_STATUS_OK
        PFB_POOL_STATUS_ERROR
        PFB_POOL_STATUS_SOCKET
        PFB_POOL_TENSOR_STRINGS
        PFB_POOL_TENSOR_PICKLED
        PFB_POOL_TENSOR_SHARED
        PFB_POOL_TENSOR_ALIASED
        PFB_POOL_TENSOR_STRIDED
        PFB_POOL_TENSOR_UNALIGNED
        PFB_POOL_TENSOR_LAZY
        PFB_POOL_TENSOR_REFUSED_MASK
        PFB_POOL_TENSOR_SOCKET
        PFB_POOL_TENSOR_SCALAR

    ctypedef struct PfbPoolMessage:
        uint16_t kind
        uint16_t slots
        uint32_t count
        uint64_t call_id
        uint64_t token
        uint32_t flags
        uint32_t status
        uint64_t block_offset
        uint64_t block_size
        uint64_t stamp
        uint64_t ended

    ctypedef struct PfbPoolTensor:
        uint8_t code
        uint8_t bits
        uint16_t lanes
        int32_t ndim
        uint32_t flags
        uint32_t reserved
        uint64_t offset
        uint64_t size
        int64_t dims[4]

    ctypedef union PfbPoolSlot:
        PfbPoolMessage message
        PfbPoolTensor tensor

    ctypedef struct PfbPoolRingWords:
        uint64_t tail
        uint64_t head

    ctypedef struct PfbPoolControl:
        uint64_t magic
        uint32_t version
        uint32_t ring_slots
        uint64_t running_call
        uint64_t running_since
        uint64_t ring_calls_started
        PfbPoolRingWords requests
        PfbPoolRingWords replies

    uint32_t pfb_pool_tensor_slots(int32_t ndim)
    uint64_t pfb_pool_control_bytes(uint32_t ring_slots)
    PfbPoolSlot* pfb_pool_request_slots(PfbPoolControl* control)
    PfbPoolSlot* pfb_pool_reply_slots(PfbPoolControl* control)
