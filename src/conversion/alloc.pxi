# 64-byte aligned NumPy data allocation (PyDataMem_SetHandler), active while a
# registered function runs so that fresh outputs qualify for zero-copy, and
# _aligned_copy, the one routine that makes the copies the bridge hands over.

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)

cdef extern from "<malloc.h>" nogil:
    size_t malloc_usable_size(void* ptr)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    enum: MADV_HUGEPAGE

cdef extern from "<unistd.h>" nogil:
    long sysconf(int name)
    enum: _SC_PAGESIZE

cdef enum:
    # Like NumPy's own allocator: blocks this large ask for transparent huge
    # pages, so that filling a fresh 64 MiB output takes 32 page faults, not 16k.
    HUGEPAGE_THRESHOLD = 4 << 20

cdef size_t _page_size = <size_t>sysconf(_SC_PAGESIZE)

# A few recently freed large blocks, kept for reuse.  A fresh output lives on
# in its tensor after the call, so the next call's output cannot reuse its
# memory the way a bare NumPy loop does; without this cache every call of a
# loop that makes a 4 MiB output took ~280 new page faults.
cdef extern from *:
    """
    #include <pthread.h>
    static pthread_mutex_t pfb_block_cache_mutex = PTHREAD_MUTEX_INITIALIZER;
    """
    int pthread_mutex_lock(void* mutex) nogil
    int pthread_mutex_unlock(void* mutex) nogil
    void* pfb_block_cache_mutex_ptr "(&pfb_block_cache_mutex)"

cdef enum:
    CACHE_MIN_BYTES = 256 << 10   # smaller blocks: glibc reuses them well
    CACHE_SLOTS = 4
cdef size_t CACHE_MAX_BYTES = 128 << 20
cdef void* _cached_block[CACHE_SLOTS]
cdef size_t _cached_usable[CACHE_SLOTS]   # malloc_usable_size of the block
cdef size_t _cached_bytes = 0
cdef int _oldest = 0   # the slot replaced next when all are taken


cdef void* _cache_take(size_t size) noexcept nogil:
    """A cached block of at least `size` usable bytes (and not much more)."""
    global _cached_bytes
    cdef void* p = NULL
    cdef int i
    pthread_mutex_lock(pfb_block_cache_mutex_ptr)
    for i in range(CACHE_SLOTS):
        if (_cached_block[i] != NULL and _cached_usable[i] >= size
                and _cached_usable[i] - size <= size // 8):
            p = _cached_block[i]
            _cached_block[i] = NULL
            _cached_bytes -= _cached_usable[i]
            break
    pthread_mutex_unlock(pfb_block_cache_mutex_ptr)
    return p


cdef bint _cache_put(void* ptr) noexcept nogil:
    """Keeps `ptr` for reuse, freeing the oldest blocks to make room; False:
    it is too large to keep, the caller frees it."""
    global _cached_bytes, _oldest
    cdef size_t usable = malloc_usable_size(ptr)
    if usable > CACHE_MAX_BYTES:
        return False
    cdef int i, slot = -1
    pthread_mutex_lock(pfb_block_cache_mutex_ptr)
    for i in range(CACHE_SLOTS):
        if _cached_block[i] == NULL:
            slot = i
            break
    # Evict oldest first (round robin) until the block fits in a free slot.
    while slot < 0 or _cached_bytes + usable > CACHE_MAX_BYTES:
        i = _oldest
        _oldest = (_oldest + 1) % CACHE_SLOTS
        if _cached_block[i] != NULL:
            free(_cached_block[i])
            _cached_block[i] = NULL
            _cached_bytes -= _cached_usable[i]
        if slot < 0:
            slot = i
    _cached_block[slot] = ptr
    _cached_usable[slot] = usable
    _cached_bytes += usable
    pthread_mutex_unlock(pfb_block_cache_mutex_ptr)
    return True


def _allocator_cache():
    """The usable sizes of the freed blocks kept for reuse (for tests)."""
    pthread_mutex_lock(pfb_block_cache_mutex_ptr)
    sizes = [_cached_usable[i] for i in range(CACHE_SLOTS) if _cached_block[i] != NULL]
    pthread_mutex_unlock(pfb_block_cache_mutex_ptr)
    return sorted(sizes)


cdef void* _aligned_malloc(void* ctx, size_t size) noexcept nogil:
    cdef void* p = NULL
    if size >= CACHE_MIN_BYTES:
        p = _cache_take(size)
        if p != NULL:
            return p
    if posix_memalign(&p, PFB_TENSOR_ALIGNMENT, size if size > 0 else 1) != 0:
        return NULL
    cdef uintptr_t start, end
    if size >= HUGEPAGE_THRESHOLD:
        start = (<uintptr_t>p + _page_size - 1) & ~(<uintptr_t>_page_size - 1)
        end = <uintptr_t>p + size
        madvise(<void*>start, end - start, MADV_HUGEPAGE)  # advice only: errors ignored
    return p

cdef void* _aligned_calloc(void* ctx, size_t nelem, size_t elsize) noexcept nogil:
    if elsize != 0 and nelem > (<size_t>-1) // elsize:
        return NULL
    cdef size_t size = nelem * elsize
    cdef void* p = _aligned_malloc(ctx, size)
    if p != NULL:
        memset(p, 0, size)
    return p

cdef void* _aligned_realloc(void* ctx, void* ptr, size_t new_size) noexcept nogil:
    # NumPy does not pass the old size: glibc knows the usable size of blocks
    # that posix_memalign made, and the tail beyond the old size is unused.
    if ptr == NULL:
        return _aligned_malloc(ctx, new_size)
    cdef void* p = _aligned_malloc(ctx, new_size)
    if p == NULL:
        return NULL
    cdef size_t old_size = malloc_usable_size(ptr)
    memcpy(p, ptr, old_size if old_size < new_size else new_size)
    free(ptr)
    return p

cdef void _aligned_free(void* ctx, void* ptr, size_t size) noexcept nogil:
    if ptr != NULL and size >= CACHE_MIN_BYTES and _cache_put(ptr):
        return
    free(ptr)

cdef cnp.PyDataMem_Handler _aligned_handler
strncpy(_aligned_handler.name, b"pyfunc_bridge_aligned64", sizeof(_aligned_handler.name) - 1)
_aligned_handler.version = 1
_aligned_handler.allocator.ctx = NULL
_aligned_handler.allocator.malloc = _aligned_malloc
_aligned_handler.allocator.calloc = _aligned_calloc
_aligned_handler.allocator.realloc = _aligned_realloc
_aligned_handler.allocator.free = _aligned_free

# Kept for the life of the module: NumPy records the handler on every array
# it allocated, and frees through it after the handler is no longer current.
cdef object _aligned_handler_capsule = PyCapsule_New(
    &_aligned_handler, b"mem_handler", NULL)


cdef class aligned_allocation:
    """Context manager: NumPy data allocated inside is 64-byte aligned.

    The bridge enters it around every call of a registered function; it is
    public for code that prepares buffers for TensorFlow itself.

    >>> import numpy as np
    >>> from pyfunc_bridge._conversion import aligned_allocation
    >>> with aligned_allocation():
    ...     a = np.empty(1000, np.uint8)
    >>> a.ctypes.data % 64
    0
    """
    cdef object _previous

    def __enter__(self):
        self._previous = cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
        return self

    def __exit__(self, *exc_info):
        cnp.PyDataMem_SetHandler(self._previous)
        self._previous = None
        return False


cdef cnp.ndarray _aligned_copy(object arr, object dtype=None):
    """A C-contiguous copy of `arr` in aligned memory (as `dtype`, cast as
    astype casts: the caller judged the values): every copy that the bridge
    hands to TensorFlow is made here, so the kernel never copies again."""
    previous = cnp.PyDataMem_SetHandler(_aligned_handler_capsule)
    try:
        return np.array(arr, dtype=dtype, order="C", copy=True)
    finally:
        cnp.PyDataMem_SetHandler(previous)
