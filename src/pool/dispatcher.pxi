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
    cdef bint _closed    # close() deleted it: this object keeps a reference
    cdef _Held _inputs
    cdef dict _held   # worker index -> (channel, _Held of its result arena)

    def __cinit__(self, input_buffer, int workers):
        self._inputs = _Held(input_buffer)
        self._held = {}
        self._d = pfb_dispatch_new(<char*>self._inputs.view.buf, self._inputs.view.len, workers)
        if self._d == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self._d == NULL or self._disowned:
            return
        if self._closed:
            pfb_dispatch_release(self._d)
        else:
            pfb_dispatch_delete(self._d)

    def close(self):
        """Closes it now, for tests (the pool drops it instead: its dealloc
        deletes it; dispatch.h, pfb_dispatch_delete): the calls in flight
        and the queued ones fail ("the pool was closed"), later ones are
        refused.  Its memory stays until this object goes (a thread of
        ``call`` may still finish its call)."""
        if self._closed or self._disowned:
            return
        self._closed = True
        pfb_dispatch_retain(self._d)  # this object's, for the methods called after
        with nogil:
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

    def call(self, uint64_t token, arrays, uint32_t flags=0, wait=None):
        """Route.call on a route of its own (so its errors), for tests: the
        DONE as (Message, NativeArena), its result blocks the caller's to
        hand back; `wait` as Route.call's."""
        reply, _ = self.route(token, flags).call(arrays, wait=wait)
        (<Reply>reply)._held.clear()  # the caller's now: it hands them back
        return reply.message, reply.arena

    def call_many(self, uint64_t token, arrays, Py_ssize_t times, uint32_t flags=0):
        """Runs the call `times` times, one after another, entirely in C
        without the GIL (each DONE's result blocks handed back at once): the
        (worker start, worker end) CLOCK_REALTIME ns of each, or None for a
        call that failed.  For tests and measurements of the native path."""
        cdef uint32_t n = len(arrays)
        cdef Py_ssize_t k
        cdef _Inputs inputs = _Inputs(arrays, None, None, flags)
        cdef uint64_t[:, ::1] stamps = np.zeros((times, 2), np.uint64)
        cdef PfbDispatchCall call
        cdef int rc = 0
        memset(&call, 0, sizeof(call))
        with nogil:
            for k in range(times):
                rc = pfb_dispatch_call(self._d, token, flags, inputs.items, n, -1, -1, &call)
                if rc:
                    break
                if call.state == PFB_DISPATCH_DONE:
                    stamps[k, 0] = call.reply[0].message.stamp
                    stamps[k, 1] = call.reply[0].message.ended
                    pfb_dispatch_reply_hand_back(&call)
                pfb_dispatch_finish(self._d, &call)
        if rc:
            raise OSError(rc, f"pyfunc_bridge: dispatching call {k} failed ({rc})")
        return [(stamps[k, 0], stamps[k, 1]) if stamps[k, 1] else None for k in range(times)]

    def free_bytes(self):
        return pfb_dispatch_free_bytes(self._d)

    def counts(self):
        """dispatch.h's PfbDispatchCounts, as a dict of its fields."""
        cdef PfbDispatchCounts c
        pfb_dispatch_counts(self._d, &c)
        return c
