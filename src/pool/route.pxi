# A pool's way to one function (PfbDispatchRoute, dispatch.h).  Kernels call
# through it without Python (src/kernel/pool_route.cc); Python calls through
# it with Route.call: eager calls and a kernel's first call, which so take the
# same rings, scheduler and statistics as the kernel's native calls.

import itertools
import pickle

import numpy as np


class Declined(OSError):
    """The dispatcher did not take a call, by errno (dispatch.h,
    pfb_dispatch_call); EINVAL too for an input that is neither numbers nor
    bytes, without a payloads dict (Route.call)."""


class DispatchFailed(RuntimeError):
    """A dispatched call failed without a reply: (TF error code, message)."""


# Payload ids of inputs pulled over the socket (PFB_POOL_TENSOR_SOCKET):
# unique in the process, as a pool's payloads dict needs.
_payload_ids = itertools.count(1)


cdef object _as_array(object value, object other):
    """`value` as the records take it (bytes: a 0-d array of bytes; a NumPy
    scalar: a 0-d array; an array as it is), or `other` for a value they
    cannot describe."""
    if isinstance(value, bytes):
        return np.array(value, dtype=object)
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    return other


cdef _put_payload(object value, PfbDispatchInput* item, dict payloads, list ids):
    """Fills `item` for an input the worker pulls over its socket: the
    pickle of `value`, as its block would have made it or as it is where no
    block could (shm_layout.h), goes into `payloads` under a fresh id (listed
    in `ids`, whose caller drops them)."""
    try:
        data = pickle.dumps(_as_array(value, value), protocol=5)
    except Exception as exc:
        raise TypeError(f"pyfunc_bridge: an input of the call (a {type(value).__name__}) "
                        f"cannot be sent to the worker process: {type(exc).__name__}: {exc}. "
                        f"Pass numbers, bytes or values that pickle, or run the function "
                        f"in-process (executor=None)") from None
    payload_id = next(_payload_ids)
    payloads[payload_id] = data
    ids.append(payload_id)
    item[0] = PfbDispatchInput(NULL, payload_id, 0, 0, 1, PFB_POOL_TENSOR_SOCKET, 0, NULL)


cdef int _ring_input(object value, PfbDispatchInput* item, int64_t* dims, list keep,
                     char** block, uint32_t call_flags, PfbInputCounts* counts) except -1:
    """Fills `item` (and `dims`) for one input by the records' one rule
    (input_records.h), from its data, dtype and shape: numbers as they are
    (kept in `keep`), bytes as a strings block (in `block`, the caller's to
    free).  0, or EINVAL."""
    cdef Py_ssize_t d, j
    cdef PfbBytes* parts
    arr = _as_array(value, None)
    if arr is None or arr.ndim > PFB_POOL_MAX_NDIM:
        return EINVAL
    for d in range(arr.ndim):
        dims[d] = arr.shape[d]
    if arr.dtype.kind == "O":
        elements = list(arr.flat)
        if not all([isinstance(element, bytes) for element in elements]):
            return EINVAL
        parts = <PfbBytes*>malloc(max(len(elements), 1) * sizeof(PfbBytes))
        if parts == NULL:
            raise MemoryError()
        for j in range(len(elements)):  # (<bytes>, unchecked: a bytes subclass too)
            parts[j] = PfbBytes(<bytes>elements[j], len(<bytes>elements[j]))
        block[0] = pfb_input_strings(item, parts, len(elements), arr.ndim, dims, counts)
        free(parts)
        if block[0] == NULL:
            raise MemoryError()
        return 0
    dl = dl_dtype(arr.dtype)
    if dl is None:
        return EINVAL
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    keep.append(arr)
    pfb_input_numbers(item, cnp.PyArray_DATA(arr), cnp.PyArray_NBYTES(arr), dl[0], dl[1], 1,
                      arr.ndim, dims, call_flags, counts)
    return 0


cdef class _Inputs:
    """A call's input records and their dims (PfbDispatchInput), made by
    _ring_input; an input it cannot describe goes by the socket (into
    `payloads`, its id in `ids`), or without `payloads` raises Declined."""
    cdef PfbDispatchInput* items
    cdef int64_t* dims
    cdef char** blocks        # the strings blocks, owned
    cdef Py_ssize_t n
    cdef list keep            # the arrays the records point to
    cdef object values
    cdef dict payloads
    cdef list ids
    cdef PfbInputCounts counts  # for the route's bytes_in

    def __cinit__(self, values, dict payloads, list ids, uint32_t call_flags):
        cdef Py_ssize_t i, n = len(values)
        self.n, self.values, self.payloads, self.ids, self.keep = n, values, payloads, ids, []
        self.items = <PfbDispatchInput*>calloc(max(n, 1), sizeof(PfbDispatchInput))
        self.dims = <int64_t*>calloc(max(n, 1) * PFB_POOL_MAX_NDIM, sizeof(int64_t))
        self.blocks = <char**>calloc(max(n, 1), sizeof(char*))
        if not (self.items and self.dims and self.blocks):
            raise MemoryError()
        for i in range(n):
            rc = _ring_input(values[i], &self.items[i], &self.dims[i * PFB_POOL_MAX_NDIM],
                             self.keep, &self.blocks[i], call_flags, &self.counts)
            if rc and payloads is not None:
                _put_payload(values[i], &self.items[i], payloads, ids)
            elif rc:
                raise Declined(rc, f"pyfunc_bridge: input {i} ({type(values[i]).__name__}) "
                                   f"is neither numbers nor bytes")

    cdef bint send(self, int rc, uint32_t* count, uint32_t* flags, PfbDispatch* d,
                   int moves) except -1:
        """Carries out the transport that pfb_input_transport chooses after a
        submit's `rc` (0: before the first): packs the call (inputs[0]
        becomes its one record, whose payload is the list of every input as
        a pulled one), or pickles the inputs it moves to the socket.
        Whether it did either (never without `payloads`)."""
        cdef uint32_t i
        if self.payloads is None:
            return False
        how = pfb_input_transport(self.items, count[0], rc,
                                  pfb_dispatch_fits(d, self.items, count[0]),
                                  pfb_dispatch_free_bytes(d) if rc == ENOSPC else 0, moves)
        if how == PFB_SEND_PACKED:
            for payload_id in self.ids:  # (those pulled alone so far)
                self.payloads.pop(payload_id, None)
            del self.ids[:]
            _put_payload([_as_array(v, v) for v in self.values], &self.items[0], self.payloads,
                         self.ids)
            flags[0] |= PFB_POOL_CALL_PACKED
            count[0] = 1
        elif how == PFB_SEND_MOVED:
            for i in range(count[0]):  # (those it moved have no payload id yet)
                if self.items[i].flags & PFB_POOL_TENSOR_SOCKET and self.items[i].nbytes == 0:
                    _put_payload(self.values[i], &self.items[i], self.payloads, self.ids)
        return how == PFB_SEND_PACKED or how == PFB_SEND_MOVED

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.blocks != NULL:
            for i in range(self.n):
                free(self.blocks[i])
        free(self.blocks)
        free(self.items)
        free(self.dims)


cdef class Route:
    """A native way to one function of a pool (PfbDispatchRoute): ``share()``
    hands a kernel a reference of its own (an address, for PfbCall.route);
    this object's reference is Python's, for ``call`` and ``counts()``
    (pfb.stats())."""
    cdef PfbDispatchRoute* _r

    def __dealloc__(self):
        pfb_dispatch_route_drop(self._r)

    def share(self):
        pfb_dispatch_route_keep(self._r)
        return <uintptr_t>self._r

    def call(self, values, dict payloads=None, wait=None, abandoned=None):
        """Runs the function on `values` (arrays of numbers or of bytes, NumPy
        scalars, bytes) in a worker (pfb_dispatch_call): (the Reply of its
        DONE, which holds its result blocks; the worker's slot).

        `payloads`: the pool's dict of inputs its workers pull over their
        sockets (docs/pool.md, "Inputs pulled over the socket", "A call
        larger than the ring"); each stays there until this returns or
        raises.  Waits without the GIL in slices and handles signals between
        them: an exception there (Ctrl-C), or `wait` seconds gone after the
        submit (TimeoutError; None: no limit), abandons the call, which a
        posted one reports to `abandoned(worker, call id)`.  Raises
        Declined, or DispatchFailed (its worker died with it, or the pool
        closed).  The route counts the pool's figures of the call; the
        caller counts the function's."""
        cdef PfbDispatchRoute* r = self._r
        cdef _Inputs records
        cdef PfbDispatchCall call
        cdef int64_t posted = pfb_clock_ns(CLOCK_REALTIME), left = _timeout_ns(wait), part
        cdef int rc = 0
        cdef int moves = 0  # times inputs were moved to the socket for room
        cdef uint32_t flags = r.flags
        cdef uint32_t count = <uint32_t>len(values)  # the CALL's records (1 once packed)
        ids = []  # payload ids of this call's inputs in `payloads`
        memset(&call, 0, sizeof(call))
        try:
            records = _Inputs(values, payloads, ids, flags)
            records.send(0, &count, &flags, r.d, 0)
            while True:
                part = _SLICE_NS if left < 0 or left > _SLICE_NS else left
                with nogil:
                    rc = pfb_dispatch_call(r.d, r.token, flags, records.items, count, _SLICE_NS,
                                           part, &call)
                if rc == ETIMEDOUT:
                    if call.id and left >= 0:  # (a slice of waiting for room is not counted)
                        left -= part
                        if left <= 0:
                            raise TimeoutError(f"pyfunc_bridge: the call was not done "
                                               f"within {wait} s (abandoned)")
                    PyErr_CheckSignals()
                elif rc and records.send(rc, &count, &flags, r.d, moves):
                    moves += 1  # the same call, with fewer blocks (the second time: none)
                elif rc:
                    raise Declined(rc, f"pyfunc_bridge: the dispatcher declined the call "
                                       f"({os.strerror(rc)})")
                else:
                    break
            if call.state == PFB_DISPATCH_FAILED:
                # (The caller counts the call, its error and its inputs' copies:
                # the function's figures.)
                if pfb_route_counting(r.counting):
                    pfb_route_count_failed(&r.counts)
                raise DispatchFailed(call.error_code,
                                     call.error.decode("utf-8", "replace") if call.error != NULL
                                     else "pyfunc_bridge: the pool call failed")
            if pfb_route_counting(r.counting):
                # (The inputs' share of the function's figures: the caller's.)
                pfb_route_count_answered(&r.counts, &call.reply[0].message, posted,
                                         records.counts.bytes, 0, 0)
                pfb_route_add(&r.counts.replied, 1)
            reply = Reply.__new__(Reply)
            (<Reply>reply)._take(&call)  # (one it refuses, it hands back)
            return reply, call.worker
        finally:
            # (Not ended here: abandoned.)
            gone = call.id if call.id and call.state != PFB_DISPATCH_DONE and (
                call.state != PFB_DISPATCH_FAILED) else 0
            pfb_dispatch_finish(r.d, &call)  # (a call never submitted: nothing to end)
            if gone and call.worker >= 0 and abandoned is not None:
                abandoned(call.worker, gone)
            for payload_id in ids:  # a worker that asks later gets None: the call fails
                payloads.pop(payload_id, None)

    def call_many(self, arrays, Py_ssize_t times):
        """Runs the call `times` times, one after another, entirely in C
        without the GIL, as a kernel's native calls (each DONE's result
        blocks handed back at once): the (worker start, worker end)
        CLOCK_REALTIME ns of each, or None for a call that failed.  For tests
        and measurements of the native path."""
        cdef PfbDispatchRoute* r = self._r
        cdef uint32_t n = len(arrays)
        cdef Py_ssize_t k
        cdef _Inputs inputs = _Inputs(arrays, None, None, r.flags)
        cdef uint64_t[:, ::1] stamps = np.zeros((times, 2), np.uint64)
        cdef PfbDispatchCall call
        cdef int rc = 0
        memset(&call, 0, sizeof(call))
        with nogil:
            for k in range(times):
                rc = pfb_dispatch_call(r.d, r.token, r.flags, inputs.items, n, -1, -1, &call)
                if rc:
                    break
                if call.state == PFB_DISPATCH_DONE:
                    stamps[k, 0] = call.reply[0].message.stamp
                    stamps[k, 1] = call.reply[0].message.ended
                    pfb_dispatch_reply_hand_back(&call)
                pfb_dispatch_finish(r.d, &call)
        if rc:
            raise OSError(rc, f"pyfunc_bridge: dispatching call {k} failed ({rc})")
        return [(stamps[k, 0], stamps[k, 1]) if stamps[k, 1] else None for k in range(times)]

    def counts(self):
        """What the route's calls added up (dispatch.h, PfbDispatchRouteCounts),
        as a dict of its fields."""
        return self._r.counts

    def clear(self):
        """Zeroes the counts (pfb.reset_stats); a call counting meanwhile may
        keep a part of its figures."""
        memset(&self._r.counts, 0, sizeof(PfbDispatchRouteCounts))

