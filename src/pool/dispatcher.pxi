# ------------------------------------------------------------- Dispatcher --

def set_counting(bint on):
    """Whether routes count their calls (pfb.enable_stats)."""
    pfb_dispatch_set_counting(on)


def counting():
    """Whether routes count their calls: the process's one statistics switch,
    which pfb.enable_stats sets."""
    return pfb_dispatch_counting() != 0


cdef class Dispatcher:
    """The Python face of a pool's dispatcher (src/pool/dispatch.h): the
    pool's lifetime calls (attach, lost, register), its routes, and calls
    for tests."""
    cdef PfbDispatch* _d
    cdef bint _disowned  # a forked child's copy: never deleted (disown)
    cdef _Held _inputs
    cdef dict _held   # worker index -> (channel, _Held of its result arena)

    def __cinit__(self, input_buffer, int workers):
        self._inputs = _Held(input_buffer)
        self._held = {}
        self._d = pfb_dispatch_new(<char*>self._inputs.view.buf, self._inputs.view.len, workers)
        if self._d == NULL:
            raise MemoryError()

    def __dealloc__(self):
        # Closes it (dispatch.h, pfb_dispatch_delete): the calls in flight and
        # the queued ones fail ("the pool was closed"), later ones are refused.
        if self._d != NULL and not self._disowned:
            pfb_dispatch_delete(self._d)

    def disown(self):
        """In a forked child: refuses every call from now on, touching
        nothing of the parent's (dispatch.h); never freed."""
        if not self._disowned:
            pfb_dispatch_disown(self._d)
            self._disowned = True

    def route(self, uint64_t token, uint32_t flags):
        """A Route to the function of `token` (registered) for CALLs with
        `flags` (PFB_POOL_CALL_*)."""
        cdef Route made = Route.__new__(Route)
        made._r = pfb_dispatch_route_new(self._d, token, flags)
        if made._r == NULL:
            raise MemoryError()
        return made

    def forget(self, uint64_t token):
        pfb_dispatch_forget(self._d, token)

    def attach(self, int index, Channel channel not None, int doorbell, results,
               uint64_t generation):
        cdef _Held held = _Held(results)
        cdef int rc = pfb_dispatch_attach(self._d, index, channel._control, doorbell,
                                          <const char*>held.view.buf, held.view.len,
                                          generation)
        if rc:
            raise OSError(rc, f"pyfunc_bridge: attaching worker {index} failed")
        self._held[index] = (channel, held)

    def lost(self, int index, int32_t code, str message, bint resend=False):
        """Worker `index` ended: its calls fail with (`code`, `message`);
        with `resend` (it died), those it had not started end RESEND."""
        cdef bytes text = message.encode("utf-8", "replace")
        cdef const char* c_text = text
        with nogil:
            pfb_dispatch_lost(self._d, index, code, c_text, resend)
        # The channel (its control segment's mapping) stays until the slot
        # is attached again: a submit that read `attached` a moment before
        # lost() may still read the segment's running call (choose()).

    def register(self, uint64_t token, const unsigned char[::1] payload):
        cdef int rc = pfb_dispatch_register(self._d, token,
                                            &payload[0] if payload.shape[0] else NULL,
                                            payload.shape[0])
        if rc == ENOMEM:
            raise MemoryError()
        if rc:
            raise OSError(rc, f"pyfunc_bridge: the dispatcher is closed: it registers "
                              f"no function (token {token})")

    def free_bytes(self):
        return pfb_dispatch_free_bytes(self._d)

    def counts(self):
        """dispatch.h's PfbDispatchCounts, as a dict of its fields."""
        cdef PfbDispatchCounts c
        pfb_dispatch_counts(self._d, &c)
        return c
