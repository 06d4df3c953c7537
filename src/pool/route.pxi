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


cdef object _as_array(object value):
    """`value` as the records take it (bytes: a 0-d array of bytes; a NumPy
    scalar: a 0-d array; an array as it is), or None: a value they cannot
    describe."""
    if isinstance(value, bytes):
        arr = np.empty((), dtype=object)
        arr[()] = value
        return arr
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    return None


cdef object _pulled(object value):
    """`value` as a worker that pulls it gets it: as its block would have
    made it, or as it is where no block could (shm_layout.h)."""
    arr = _as_array(value)
    return value if arr is None else arr


cdef _put_payload(object value, PfbDispatchInput* item, dict payloads, list ids):
    """Fills `item` for an input the worker pulls over its socket: the
    pickle of `value` goes into `payloads` under a fresh id (listed in
    `ids`, whose caller drops them)."""
    try:
        data = pickle.dumps(value, protocol=5)
    except Exception as exc:
        raise TypeError(f"pyfunc_bridge: an input of the call (a {type(value).__name__}) "
                        f"cannot be sent to the worker process: {type(exc).__name__}: {exc}. "
                        f"Pass numbers, bytes or values that pickle, or run the function "
                        f"in-process (executor=None)") from None
    payload_id = next(_payload_ids)
    payloads[payload_id] = data
    ids.append(payload_id)
    item.data = NULL
    item.nbytes = payload_id
    item.code = item.bits = 0
    item.lanes = 1
    item.flags = PFB_POOL_TENSOR_SOCKET
    item.ndim = 0


cdef bint _packed(object values, PfbDispatchInput* inputs, uint32_t* count, uint32_t* flags,
                  PfbDispatch* d, dict payloads, list ids) except -1:
    """Packs a call whose records would not fit the ring (pfb_dispatch_fits;
    PFB_POOL_CALL_PACKED): inputs[0] becomes its one record, whose payload
    is the list of every input as a pulled one (those pulled alone so far
    are dropped).  Whether it did."""
    if payloads is None or count[0] < 2 or pfb_dispatch_fits(d, inputs, count[0]):
        return False
    for payload_id in ids:
        payloads.pop(payload_id, None)
    del ids[:]
    _put_payload([_pulled(value) for value in values], &inputs[0], payloads, ids)
    flags[0] |= PFB_POOL_CALL_PACKED
    count[0] = 1
    return True


cdef bint _move_to_socket(object values, PfbDispatchInput* inputs, Py_ssize_t n, uint64_t room,
                          dict payloads, list ids) except -1:
    """The rule for a call whose inputs the arena has no room for (ENOSPC)
    or never will (E2BIG): its largest inputs go by the socket until the
    rest fit the room free now (`room`; with 0, or where none needs to,
    all of them).  Whether any moved."""
    cdef Py_ssize_t i
    blocks = []  # (its block's bytes, index) of each input that has one
    for i in range(n):
        if not inputs[i].flags & PFB_POOL_TENSOR_SOCKET:
            blocks.append((-(-<object>inputs[i].nbytes // PFB_POOL_ALIGN) * PFB_POOL_ALIGN, i))
    blocks.sort(reverse=True)
    need = sum(size for size, _ in blocks)
    moved = False
    for size, i in blocks:
        if room and need <= room:
            break
        need -= size
        _put_payload(_pulled(values[i]), &inputs[i], payloads, ids)
        moved = True
    if not moved and room:  # they fit the room in bytes, not in its pieces: all go
        return _move_to_socket(values, inputs, n, 0, payloads, ids)
    return moved


cdef int _ring_input(object value, PfbDispatchInput* item, int64_t* dims, list keep,
                     uint64_t* data_bytes) except -1:
    """Fills `item` (and `dims`) for one input as the dispatcher takes it,
    numbers as they are and bytes as a strings block (shm_layout.h), keeping
    what it points to in `keep`; adds its data's bytes (strings' without
    their length prefixes) to `data_bytes`.  0, or EINVAL."""
    cdef Py_ssize_t d
    arr = _as_array(value)
    if arr is None:
        return EINVAL
    if arr.ndim > PFB_POOL_MAX_NDIM:
        return EINVAL
    kind = arr.dtype.kind
    if kind == "O":
        parts = []
        total = 0
        for element in arr.flat:
            if not isinstance(element, bytes):
                return EINVAL
            parts.append(len(element).to_bytes(8, "little"))
            parts.append(element)
            total += len(element)
        block = b"".join(parts)
        keep.append(block)
        item.data = <const char*>block
        item.nbytes = len(block)
        item.code = item.bits = 0
        item.flags = PFB_POOL_TENSOR_STRINGS
        data_bytes[0] += total
    else:
        dl = dl_dtype(arr.dtype)
        if dl is None:
            return EINVAL
        item.code = dl[0]
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        keep.append(arr)
        item.data = cnp.PyArray_DATA(arr)
        item.nbytes = cnp.PyArray_NBYTES(arr)
        item.bits = arr.dtype.itemsize * 8
        item.flags = 0
        data_bytes[0] += item.nbytes
    item.lanes = 1
    item.ndim = arr.ndim
    item.dims = dims
    for d in range(arr.ndim):
        dims[d] = arr.shape[d]
    return 0


cdef class _Inputs:
    """A call's input records and their dims (PfbDispatchInput), made by
    _ring_input; an input it cannot describe goes by the socket (into
    `payloads`, its id in `ids`), or without `payloads` raises Declined."""
    cdef PfbDispatchInput* items
    cdef int64_t* dims
    cdef list keep            # what the records point to
    cdef uint64_t data_bytes  # _ring_input's count, for the route's bytes_in

    def __cinit__(self, values, dict payloads, list ids):
        cdef Py_ssize_t n = len(values), i
        self.items = <PfbDispatchInput*>calloc(max(n, 1), sizeof(PfbDispatchInput))
        self.dims = <int64_t*>calloc(max(n, 1) * PFB_POOL_MAX_NDIM, sizeof(int64_t))
        self.keep = []
        if self.items == NULL or self.dims == NULL:
            raise MemoryError()
        for i in range(n):
            rc = _ring_input(values[i], &self.items[i], &self.dims[i * PFB_POOL_MAX_NDIM],
                             self.keep, &self.data_bytes)
            if rc and payloads is not None:
                _put_payload(_pulled(values[i]), &self.items[i], payloads, ids)
            elif rc:
                raise Declined(rc, f"pyfunc_bridge: input {i} ({type(values[i]).__name__}) "
                                   f"is neither numbers nor bytes")

    def __dealloc__(self):
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

    @property
    def token(self):
        return self._r.token

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
        cdef PfbDispatchInput* inputs
        cdef PfbDispatchCall call
        cdef const PfbPoolMessage* m
        cdef int64_t posted = _clock_ns(CLOCK_REALTIME), left = _timeout_ns(wait), part
        cdef int rc = 0
        cdef int moves = 0  # times inputs were moved to the socket for room
        cdef uint32_t flags = r.flags
        cdef uint32_t count = <uint32_t>len(values)  # the CALL's records (1 once packed)
        ids = []  # payload ids of this call's inputs in `payloads`
        memset(&call, 0, sizeof(call))
        try:
            records = _Inputs(values, payloads, ids)
            inputs = records.items
            _packed(values, inputs, &count, &flags, r.d, payloads, ids)
            while True:
                part = _SLICE_NS if left < 0 or left > _SLICE_NS else left
                with nogil:
                    rc = pfb_dispatch_call(r.d, r.token, flags, inputs, count, _SLICE_NS, part,
                                           &call)
                if rc == ETIMEDOUT:
                    if call.id and left >= 0:  # (a slice of waiting for room is not counted)
                        left -= part
                        if left <= 0:
                            raise TimeoutError(f"pyfunc_bridge: the call was not done "
                                               f"within {wait} s (abandoned)")
                    PyErr_CheckSignals()
                elif (rc == ENOSPC or rc == E2BIG) and payloads is not None and (
                        # (the rings' size may have come meanwhile)
                        _packed(values, inputs, &count, &flags, r.d, payloads, ids)
                        or _move_to_socket(values, inputs, count,
                                           pfb_dispatch_free_bytes(r.d)
                                           if rc == ENOSPC and not moves else 0,
                                           payloads, ids)):
                    moves += 1  # the same call, with fewer blocks (the second time: none)
                elif rc:
                    raise Declined(rc, f"pyfunc_bridge: the dispatcher declined the call "
                                       f"({os.strerror(rc)})")
                else:
                    break
            if call.state == PFB_DISPATCH_FAILED:
                # (The caller counts the call, its error and its inputs' copies:
                # the function's figures.)
                raise DispatchFailed(call.error_code,
                                     call.error.decode("utf-8", "replace") if call.error != NULL
                                     else "pyfunc_bridge: the pool call failed")
            if pfb_route_counting(r.counting):
                # (The inputs' share of the function's figures: the caller's.)
                pfb_route_count_answered(&r.counts, &call.reply[0].message, posted,
                                         records.data_bytes, 0, 0)
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

    def counts(self):
        """What the route's calls added up (dispatch.h, PfbDispatchRouteCounts),
        as a dict of its fields."""
        return self._r.counts

    def clear(self):
        """Zeroes the counts (pfb.reset_stats); a call counting meanwhile may
        keep a part of its figures."""
        memset(&self._r.counts, 0, sizeof(PfbDispatchRouteCounts))

