# The one declaration of records.h, the messages' records.
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t

from includes.shm_layout cimport PfbPoolSlot, PfbPoolTensor

cdef extern from "records.h" nogil:
    enum:
        PFB_POOL_MAX_MESSAGE_SLOTS

    bint pfb_pool_message_fits(uint64_t slots, uint32_t ring_slots)
    uint32_t pfb_pool_words_per_message(uint32_t ring_slots)
    void pfb_msg_init(PfbPoolSlot* out, uint16_t kind)
    int pfb_msg_add_tensor(PfbPoolSlot* out, uint32_t max_slots, const PfbPoolTensor* tensor,
                           const int64_t* dims)
    int pfb_msg_add_word(PfbPoolSlot* out, uint32_t max_slots, uint64_t word)
    int pfb_msg_read_tensor(const PfbPoolSlot* message, uint32_t* cursor, PfbPoolTensor* tensor,
                            int64_t* dims)
    int pfb_msg_read_word(const PfbPoolSlot* message, uint32_t index, uint64_t* word)
