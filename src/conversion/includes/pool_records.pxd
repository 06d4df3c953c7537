# The conversion layer's declaration of the one function of the pool's
# records.h it calls (the pool module declares the rest, src/pool/includes).
from libc.stdint cimport uint64_t

cdef extern from "pool/records.h" nogil:
    bint pfb_pool_block_holds(uint64_t offset, uint64_t size, uint64_t nbytes,
                              uint64_t arena_bytes)
