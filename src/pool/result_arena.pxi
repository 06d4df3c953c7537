# ------------------------------------------------------------ ResultArena --

# PfbArenaBlock.user of a result block: its state, and the call that made it.
cdef enum:
    _ARRAY = 1      # a NumPy array of this worker holds it (freed when the array goes)
    _SENT = 2       # the parent holds it (until it hands it back)
    _CALL_SHIFT = 8  # the rest: the call during which it was allocated


cdef struct _Handler:
    # First: NumPy reads the handler through the capsule's pointer.
    PyDataMem_Handler numpy
    # The arena's bookkeeping; every access holds `lock` (arrays die on any
    # thread, and the handler runs without the GIL).
    pthread_mutex_t lock
    PfbArena* arena
    char* base           # this process's mapping of the result arena
    uint64_t min_bytes   # smaller allocations use the ordinary allocator
    uint64_t call        # the call running now (numbered from 1)
    uint64_t fell_back   # allocations of min_bytes or more that did not fit
    PyObject* held       # a _Held, owned: keeps the mapping (exported, an mmap cannot close)


cdef inline bint _in_arena(_Handler* h, const void* p) noexcept nogil:
    return h.base <= <const char*>p < h.base + pfb_arena_bytes(h.arena)


cdef void* _arena_malloc(_Handler* h, size_t size) noexcept nogil:
    """An arena block for a NumPy array, or NULL (small, or no room)."""
    cdef uint64_t offset, got
    if size < h.min_bytes:
        return NULL
    pthread_mutex_lock(&h.lock)
    if pfb_arena_alloc(h.arena, size, &offset, &got) != 0:
        h.fell_back += 1
        pthread_mutex_unlock(&h.lock)
        return NULL
    pfb_arena_find(h.arena, offset).user = _ARRAY | (h.call << _CALL_SHIFT)
    pthread_mutex_unlock(&h.lock)
    return h.base + offset


cdef bint _let_go(_Handler* h, uint64_t offset, uint64_t holder) noexcept nogil:
    """`holder` (_ARRAY: its NumPy array went; _SENT: the parent handed it
    back) no longer holds the block at `offset`, which goes back to the arena
    once neither holds it.  False for a block `holder` does not hold: left
    alone rather than corrupting the bookkeeping."""
    pthread_mutex_lock(&h.lock)
    cdef PfbArenaBlock* block = pfb_arena_find(h.arena, offset)
    cdef bint ok = block != NULL and block.offset == offset and block.user & holder
    if ok:
        block.user &= ~holder
        if not block.user & (_ARRAY | _SENT):
            pfb_arena_free(h.arena, offset)
    pthread_mutex_unlock(&h.lock)
    return ok


cdef void* _handler_malloc(void* ctx, size_t size) noexcept nogil:
    cdef void* p = _arena_malloc(<_Handler*>ctx, size)
    return p if p != NULL else malloc(size if size else 1)


cdef void* _handler_calloc(void* ctx, size_t nelem, size_t elsize) noexcept nogil:
    if elsize and nelem > SIZE_MAX // elsize:
        return NULL
    cdef size_t size = nelem * elsize
    cdef void* p = _arena_malloc(<_Handler*>ctx, size)
    if p != NULL:
        memset(p, 0, size)  # a reused block holds an earlier call's bytes
        return p
    return calloc(size if size else 1, 1)


cdef void* _handler_realloc(void* ctx, void* p, size_t size) noexcept nogil:
    cdef _Handler* h = <_Handler*>ctx
    cdef uint64_t held = 0
    cdef PfbArenaBlock* block
    cdef void* moved
    if p == NULL:
        return _handler_malloc(ctx, size)
    if not _in_arena(h, p):
        return realloc(p, size if size else 1)
    pthread_mutex_lock(&h.lock)
    block = pfb_arena_find(h.arena, <char*>p - h.base)
    if block != NULL:
        held = block.size - <uint64_t>(<char*>p - h.base - block.offset)
    pthread_mutex_unlock(&h.lock)
    if size <= held:
        return p  # the block has room (or the array shrinks)
    moved = _handler_malloc(ctx, size)
    if moved == NULL:
        return NULL  # realloc's contract: `p` stays valid
    memcpy(moved, p, held)
    _let_go(h, <char*>p - h.base, _ARRAY)
    return moved


cdef void _handler_free(void* ctx, void* p, size_t size) noexcept nogil:
    cdef _Handler* h = <_Handler*>ctx
    if p != NULL and _in_arena(h, p):
        _let_go(h, <char*>p - h.base, _ARRAY)
    else:
        free(p)


cdef void _destroy_handler_parts(_Handler* h) noexcept:
    Py_XDECREF(h.held)  # the handler's reference: the mapping may close once the view goes
    pfb_arena_delete(h.arena)
    pthread_mutex_destroy(&h.lock)
    free(h)


cdef void _destroy_handler(object capsule) noexcept:
    # Runs when the last array allocated through the handler and the
    # ResultArena are gone (each holds the capsule): nothing can reach the
    # arena any more.
    cdef _Handler* h = <_Handler*>PyCapsule_GetPointer(capsule, "mem_handler")
    if h != NULL:
        _destroy_handler_parts(h)


cdef class ResultArena:
    """A worker's result arena (a writable buffer: the mapping of its memfd)
    with its block allocator and NumPy data-memory handler.

    ``call(func, args)`` runs ``func(*args)`` with the handler installed in
    this thread's context: NumPy arrays of at least `min_bytes` (default
    64 KiB) that the function makes are allocated in the arena (what does not
    fit goes to the ordinary allocator), and the handler is uninstalled when
    it returns.
    ``take(result)`` then hands a result to the parent without a copy, if its
    memory came from the arena during that call and nothing else in this
    worker can reach it (no other reference to it or to the arrays it views,
    no weak reference); anything else is copied (``reserve``) by the caller.
    An arena block freed by NumPy goes back at once, unless the parent holds
    it: then when both have let go (``hand_back``).

    >>> import mmap, numpy as np
    >>> results = ResultArena(mmap.mmap(-1, 1 << 20), min_bytes=1)
    >>> out = results.call(np.ones, (1000,))
    >>> out.ctypes.data - results.address, results.take(out)  # in the arena, at 0
    (0, (0, 8000))
    """
    cdef _Handler* _h
    cdef object _capsule   # owns _h; arrays allocated through it hold it too
    cdef dict _exclusive   # id(result) -> its block's offset, for the last call

    def __cinit__(self, buffer, uint64_t min_bytes=65536):
        cdef _Held held = _Held(buffer)
        if <uintptr_t>held.view.buf % PFB_POOL_ALIGN:
            raise ValueError(f"pyfunc_bridge: a result arena must start on a "
                             f"{PFB_POOL_ALIGN}-byte boundary (an mmap does)")
        cdef _Handler* h = <_Handler*>calloc(1, sizeof(_Handler))
        if h == NULL:
            raise MemoryError()
        h.arena = pfb_arena_new(held.view.len)
        if h.arena == NULL:
            free(h)
            raise MemoryError()
        pthread_mutex_init(&h.lock, NULL)
        Py_INCREF(held)  # the handler's reference, dropped with it (_destroy_handler_parts)
        h.held = <PyObject*>held
        h.base = <char*>held.view.buf
        h.min_bytes = min_bytes
        strncpy(h.numpy.name, HANDLER_NAME.encode(), sizeof(h.numpy.name) - 1)
        h.numpy.version = 1
        h.numpy.allocator = PyDataMemAllocator(h, _handler_malloc, _handler_calloc,
                                               _handler_realloc, _handler_free)
        try:
            self._capsule = PyCapsule_New(h, "mem_handler", _destroy_handler)
        except BaseException:
            _destroy_handler_parts(h)
            raise
        self._h = h  # the capsule owns it from here
        self._exclusive = {}

    @property
    def size(self):
        return pfb_arena_bytes(self._h.arena)

    @property
    def address(self):
        """This process's address of the arena's first byte."""
        return <uintptr_t>self._h.base

    @property
    def fell_back(self):
        """Allocations of min_bytes or more that did not fit the arena."""
        return self._h.fell_back

    def free_bytes(self):
        pthread_mutex_lock(&self._h.lock)
        n = pfb_arena_free_bytes(self._h.arena)
        pthread_mutex_unlock(&self._h.lock)
        return n

    def live_blocks(self):
        pthread_mutex_lock(&self._h.lock)
        n = pfb_arena_live_blocks(self._h.arena)
        pthread_mutex_unlock(&self._h.lock)
        return n

    def call(self, func, args):
        """``func(*args)`` with the arena's handler installed (in this
        thread's context; uninstalled when it returns or raises)."""
        cdef _Handler* h = self._h
        pthread_mutex_lock(&h.lock)
        h.call += 1
        pthread_mutex_unlock(&h.lock)
        self._exclusive.clear()
        previous = PyDataMem_SetHandler(self._capsule)
        try:
            result = func(*args)
        finally:
            PyDataMem_SetHandler(previous)
        # Judged now, while the references are exactly those the function
        # left: `result` (this frame's) and a tuple's or list's own.
        self._judge(<PyObject*>result)
        return result

    cdef void _judge(self, PyObject* result) except *:
        cdef Py_ssize_t i
        if Py_REFCNT(result) != 1:
            return  # the function (or something it called) kept the result
        if PyTuple_CheckExact(<object>result):
            for i in range(PyTuple_GET_SIZE(<object>result)):
                self._consider(<PyObject*>PyTuple_GET_ITEM(<object>result, i))
        elif PyList_CheckExact(<object>result):
            for i in range(PyList_GET_SIZE(<object>result)):
                self._consider(<PyObject*>PyList_GET_ITEM(<object>result, i))
        else:
            self._consider(result)

    cdef void _consider(self, PyObject* obj) except *:
        """Records `obj` as exclusive when its memory is a block this call
        allocated and only its one referrer (the result, or its container)
        can reach it."""
        cdef _Handler* h = self._h
        cdef PfbArenaBlock* block
        cdef uint64_t offset
        cdef bint fresh
        cdef void* data
        # The copy facts' rule (copy_facts.h), every chain end foreign: memory
        # NumPy did not allocate (a buffer, an input's view) is not the call's.
        if (Py_TYPE(obj) != &PyArray_Type
                or pfb_writable_elsewhere(obj, Py_REFCNT(obj) - 1, _foreign_end, NULL)):
            return
        data = PyArray_DATA(<PyArrayObject*>obj)
        if (not _in_arena(h, data) or not PyArray_IS_C_CONTIGUOUS(<PyArrayObject*>obj)
                or PyArray_NBYTES(<PyArrayObject*>obj) == 0):
            return
        offset = <char*>data - h.base
        pthread_mutex_lock(&h.lock)
        block = pfb_arena_find(h.arena, offset)
        fresh = (block != NULL and block.offset == offset and block.user & _ARRAY
                 and not block.user & _SENT and block.user >> _CALL_SHIFT == h.call
                 and <uint64_t>PyArray_NBYTES(<PyArrayObject*>obj) <= block.size)
        pthread_mutex_unlock(&h.lock)
        if fresh:
            self._exclusive[<uintptr_t>obj] = offset

    def take(self, value):
        """The block of `value`, a result of the last ``call``, when it may be
        handed over as it is: ``(offset, size)``, from now on the parent's
        (post it, or give it back with ``hand_back``).  None otherwise: the
        caller copies it (``reserve``)."""
        cdef _Handler* h = self._h
        cdef PfbArenaBlock* block
        cdef bint ok
        cdef uint64_t size = 0
        offset = self._exclusive.pop(<uintptr_t><PyObject*>value, None)
        if offset is None or not isinstance(value, cnp.ndarray):
            return None
        if <char*>cnp.PyArray_DATA(value) != h.base + <uint64_t>offset:
            return None
        pthread_mutex_lock(&h.lock)
        block = pfb_arena_find(h.arena, offset)
        ok = block != NULL and block.user & _ARRAY and not block.user & _SENT
        if ok:
            block.user |= _SENT
            size = block.size
        pthread_mutex_unlock(&h.lock)
        return (offset, size) if ok else None

    def reserve(self, uint64_t nbytes):
        """A fresh block for a copy of a result, already the parent's (post
        it, or give it back with ``hand_back``): (offset, size), or None when
        the arena has no room."""
        cdef _Handler* h = self._h
        cdef uint64_t offset, size
        cdef int rc
        pthread_mutex_lock(&h.lock)
        rc = pfb_arena_alloc(h.arena, nbytes, &offset, &size)
        if rc == 0:
            pfb_arena_find(h.arena, offset).user = _SENT | (h.call << _CALL_SHIFT)
        pthread_mutex_unlock(&h.lock)
        return (offset, size) if rc == 0 else None

    def hand_back(self, uint64_t offset):
        """The parent no longer holds the block at `offset`: it is freed (now,
        or when this worker's own array over it goes).  ValueError for a
        block the parent does not hold (handed back twice, or never sent)."""
        if not _let_go(self._h, offset, _SENT):
            raise ValueError(f"pyfunc_bridge: result block {offset} was handed back, but "
                             f"the parent does not hold it (handed back twice, or never "
                             f"sent)")
