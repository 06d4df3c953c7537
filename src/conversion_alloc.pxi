# 64-byte aligned NumPy data allocation (PyDataMem_SetHandler), active while a
# registered function runs so that fresh outputs qualify for zero-copy.

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
    ALIGNMENT = 64
    # Like NumPy's own allocator: blocks this large ask for transparent huge
    # pages, so that filling a fresh 64 MiB output takes 32 page faults, not 16k.
    HUGEPAGE_THRESHOLD = 4 << 20

cdef size_t _page_size = <size_t>sysconf(_SC_PAGESIZE)

cdef void* _aligned_malloc(void* ctx, size_t size) noexcept nogil:
    cdef void* p = NULL
    if posix_memalign(&p, ALIGNMENT, size if size > 0 else 1) != 0:
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
