# Per-function statistics: calls, errors, bytes handed over without a copy,
# bytes copied (by reason), time in the function and in the conversion layer.
#
# A call counts into a _CallCounts on the driver's stack (_run, bridge.pxi), so
# that a function that releases the GIL cannot mix two calls up, and is added
# to its function's record at the end, with the GIL held: the records need no
# lock of their own.  The record is found by name once per entry (and once per
# kernel, which caches it with the entry: _Site, bridge.pxi), never per call.
# Times are read as CPU ticks (rdtsc on x86-64: a few ns, against 20-30 ns
# for clock_gettime) and turned into seconds when a snapshot is taken.

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec* tp)
    enum: CLOCK_MONOTONIC

cdef extern from *:
    """
    #if defined(__x86_64__)
    #include <x86intrin.h>
    /* The invariant TSC: constant rate, not stopped in idle states. */
    static inline unsigned long long pfb_ticks(void) { return __rdtsc(); }
    #else
    #include <time.h>
    static inline unsigned long long pfb_ticks(void) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    }
    #endif
    """
    uint64_t pfb_ticks() noexcept nogil

# _CallCounts.copied is in the order of COPY_REASONS (copy.pxi).
cdef enum:
    _NUM_REASONS = 9
    _STRING = 4
    _COPY_REQUESTED = 5
    _WORKER = 7
    _SHARED_INPUT = 8
cdef dict _REASON_INDEX = {reason: i for i, reason in enumerate(COPY_REASONS)}


cdef struct _CallCounts:
    int64_t zero_copy
    int64_t copied[_NUM_REASONS]
    uint64_t start      # entering _run (ticks)
    uint64_t called     # the function is called
    uint64_t returned   # the function returned (0: it raised)


cdef inline uint64_t _now() noexcept nogil:
    return pfb_ticks()


cdef int64_t _monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


# Ticks -> seconds: the tick rate measured against CLOCK_MONOTONIC since the
# module was loaded (the longer ago, the more precise).
cdef uint64_t _ticks_at_load = pfb_ticks()
cdef int64_t _ns_at_load = _monotonic_ns()
cdef enum:
    _CALIBRATION_NS = 20000000   # at least 20 ms between the two readings


cdef double _seconds_per_tick():
    cdef int64_t ns = _monotonic_ns()
    while ns - _ns_at_load < _CALIBRATION_NS:  # only right after the import
        ns = _monotonic_ns()
    cdef uint64_t ticks = pfb_ticks()
    if ticks <= _ticks_at_load:
        return 1e-9
    return (ns - _ns_at_load) * 1e-9 / <double>(ticks - _ticks_at_load)


cdef class _FunctionStats:
    """Counters of one function name (GIL held on every update), and the
    process-pool routes whose native calls (counted by kernels, without
    Python: src/pool/dispatch.h) add to them when they are read."""
    cdef int64_t calls
    cdef int64_t errors
    cdef int64_t zero_copy
    cdef int64_t copied[_NUM_REASONS]
    cdef uint64_t in_function   # ticks
    cdef uint64_t marshalling   # ticks
    cdef dict routes            # id -> the worker module's Route

    cdef clear(self):
        memset(self.copied, 0, sizeof(self.copied))
        self.calls = self.errors = self.zero_copy = 0
        self.in_function = self.marshalling = 0
        if self.routes:
            for route in self.routes.values():
                route.clear()

    cdef int64_t all_calls(self):
        cdef int64_t n = self.calls
        if self.routes:
            for route in self.routes.values():
                c = route.counts()
                n += c["calls"] - c["replied"] + c["errors"]
        return n

    cdef tuple snapshot(self, double seconds_per_tick):
        cdef int64_t calls = self.calls, errors = self.errors, zero_copy = self.zero_copy
        copied = [self.copied[i] for i in range(_NUM_REASONS)]
        cdef double in_function = self.in_function * seconds_per_tick
        cdef double marshalling = self.marshalling * seconds_per_tick
        if self.routes:
            for route in self.routes.values():
                c = route.counts()
                # (the replied ones count here; those failed natively, not
                # answered, only there)
                calls += c["calls"] - c["replied"] + c["errors"]
                errors += c["errors"]
                zero_copy += c["shared_out"]
                copied[_WORKER] += c["worker_in"] + c["worker_copied"]
                copied[_STRING] += c["strings_in"]
                copied[_COPY_REQUESTED] += c["copied_out"]
                in_function += c["worker_ns"] * 1e-9
                marshalling += max(0, c["total_ns"] - c["worker_ns"]) * 1e-9
        return (calls, errors, zero_copy, tuple(copied), in_function, marshalling)


# On by default: counting costs a few percent of the per-call overhead (the
# benchmark suite measures it every run: graph_overhead's statistics on/off).
cdef bint _stats_on = True
# display name -> _FunctionStats.  Records are cleared in place, never
# dropped, so that an entry (Entry.stats_record) and a kernel's cache (_Site)
# may keep their record.
cdef dict _stats_records = {}


cdef inline _CallCounts* _stats_begin(_CallCounts* counts, bint needed) noexcept:
    """Zeroes `counts` and stamps the start; NULL when not `needed` (neither
    the statistics nor a profiler session count the call)."""
    if not needed:
        return NULL
    memset(counts, 0, sizeof(_CallCounts))
    counts.start = _now()
    return counts


cdef int _count_bytes(_CallCounts* counts, object reason, Py_ssize_t nbytes) except -1:
    """`nbytes` handed over without a copy (`reason` None) or copied for `reason`."""
    if reason is None:
        counts.zero_copy += nbytes
    else:
        counts.copied[<int>_REASON_INDEX[reason]] += nbytes
    return 0


cdef int _count_string_records(_CallCounts* counts, DLManagedTensorVersioned* m) except -1:
    """The bytes of a string tensor's records (they are always converted)."""
    cdef DLTensor* t = &m.dl_tensor
    cdef const PfbStringRef* records = <const PfbStringRef*>(<char*>t.data + t.byte_offset)
    cdef int64_t n = 1, j
    cdef int i
    for i in range(t.ndim):
        n *= t.shape[i]
    for j in range(n):
        counts.copied[_STRING] += records[j].size
    return 0


cdef inline int64_t* _numeric_counter(_CallCounts* counts, int copy_mode) noexcept:
    """Where a numeric input's bytes count: copied as asked (copy=True), else
    handed over without a copy."""
    return &counts.copied[_COPY_REQUESTED] if copy_mode == PFB_COPY_TRUE else &counts.zero_copy


cdef int _count_input(_CallCounts* counts, object arg, int64_t* numeric) except -1:
    """Counts one input as the function takes it: a numeric ndarray's bytes
    into `numeric` (_numeric_counter, or the worker reason); strings, as bytes
    (a 0-d input in a graph) or an object array of bytes, were converted; a
    NumPy scalar (a value, no memory of TF's) or a framework's array is not
    counted here."""
    if type(arg) is bytes:
        counts.copied[_STRING] += len(<bytes>arg)
    elif PyArray_Check(<PyObject*>arg):
        if cnp.PyArray_TYPE(<cnp.ndarray>arg) == cnp.NPY_OBJECT:
            for item in arg.flat:
                counts.copied[_STRING] += len(item)
        else:
            numeric[0] += cnp.PyArray_NBYTES(<cnp.ndarray>arg)
    return 0


cdef int _count_inputs(_CallCounts* counts, tuple args, int64_t* numeric) except -1:
    """Counts every input (_count_input)."""
    for arg in args:
        _count_input(counts, arg, numeric)
    return 0


# Autograph re-creates functions defined inside a tf.function in generated
# factories; their qualname then starts with these.
cdef str _AUTOGRAPH_FACTORY = "inner_factory.<locals>."


cdef str _qualname(object func):
    """The function's __qualname__ (as the user wrote it: without autograph's
    factory prefix)."""
    name = (getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
            or type(func).__qualname__)
    cdef Py_ssize_t factory = name.rfind(_AUTOGRAPH_FACTORY)
    if factory >= 0:
        name = name[factory + len(_AUTOGRAPH_FACTORY):]
    return name


cdef str _display_name(object entry):
    """The op's `name=`, else the function's __qualname__."""
    name = getattr(entry, "name", None)
    if name:
        return name
    return _qualname(entry.func)


# Eager calls make an entry per call: the record found last by name is kept
# with its function (weakly) and name, so that a loop of eager calls of one
# function does not look its name up every call.
cdef object _last_func = None    # weakref.ref of that function, or None
cdef object _last_name = None    # the entry's `name` it was found with
cdef _FunctionStats _last_record = None


cdef _FunctionStats _record_of(object entry):
    """The record `entry`'s calls count into, kept on the entry once found."""
    global _last_func, _last_name, _last_record
    cdef _FunctionStats record = getattr(entry, "stats_record", None)
    if record is not None:
        return record
    func = entry.func
    name = getattr(entry, "name", None)
    if (_last_func is not None and name is _last_name and _last_func() is func):
        record = _last_record
    else:
        display = _display_name(entry)
        record = _stats_records.get(display)
        if record is None:
            record = _FunctionStats.__new__(_FunctionStats)
            _stats_records[display] = record
        try:
            _last_func = weakref.ref(func)
        except TypeError:  # not weakly referenceable: found by name every time
            _last_func = None
        _last_name = name
        _last_record = record
    try:
        entry.stats_record = record  # found without a name next time
    except AttributeError:
        pass
    return record


cdef int _stats_end(_CallCounts* counts, _FunctionStats record, bint failed) except -1:
    """Adds one call to its function's record."""
    cdef uint64_t end = _now()
    cdef uint64_t returned = counts.returned if counts.returned != 0 else end
    cdef int i
    record.calls += 1
    if failed:
        record.errors += 1
    record.zero_copy += counts.zero_copy
    for i in range(_NUM_REASONS):
        record.copied[i] += counts.copied[i]
    if counts.called != 0:
        record.in_function += returned - counts.called
        record.marshalling += (counts.called - counts.start) + (end - returned)
    else:  # failed before the function was called
        record.marshalling += end - counts.start
    return 0


def stats_snapshot():
    """name -> (calls, errors, bytes_zero_copy, bytes_copied by COPY_REASONS,
    seconds_in_function, seconds_marshalling), for functions with calls."""
    cdef double seconds_per_tick = _seconds_per_tick()
    return {name: (<_FunctionStats>record).snapshot(seconds_per_tick)
            for name, record in _stats_records.items()
            if (<_FunctionStats>record).all_calls()}


cdef int _count_route(_FunctionStats record, object route) except -1:
    """`record`'s kernels run its calls natively over `route` (its own) from
    now on: they count into it through the route."""
    if record.routes is None:
        record.routes = {}
    record.routes[id(route)] = route
    return 0


def reset_stats():
    """Clears every function's counters."""
    for record in _stats_records.values():
        (<_FunctionStats>record).clear()


def enable_stats(bint flag=True):
    """Switches counting on or off; returns the previous setting."""
    global _stats_on
    previous = _stats_on
    _stats_on = flag
    return previous


def stats_enabled():
    """Whether calls are counted."""
    return _stats_on
