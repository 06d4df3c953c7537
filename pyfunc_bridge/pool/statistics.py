"""Statistics per ProcessPool: what the pool's calls cost and what its workers
went through, by pool name (``pfb.stats().pools``).

Every call counts in its route (dispatch.h), whether a kernel or Python
made it, without Python: a record adds up its pools' routes when it is
read.  Whoever decodes a DONE in Python adds its results' share
(add), and the pool counts replacements and timeouts; each record
has a lock of its own.  Records
are cleared in place, never dropped, so that a pool may keep its record; a
pool closed since still shows until ``pfb.reset_stats()``.  Counting follows
``pfb.enable_stats`` (the pool module's switch, set with the conversion
layer's).
"""
import collections
import dataclasses

from pyfunc_bridge import _locks
from pyfunc_bridge.worker.compiled import pool_module


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """Counters of one pool name.

    - ``calls``: calls its workers answered (returned or raised);
    - ``seconds_queued``: from a call being posted in this process to its
      worker starting it (the wait for the worker and the way there);
    - ``seconds_in_workers``: from a worker starting a call to its reply being
      ready: the function, reading its inputs and writing its results;
    - ``bytes_in`` / ``bytes_out``: the data of the inputs and the results
      (arrays' bytes, strings' bytes; a Python number counts 0), whether it
      travelled in shared memory or pickled;
    - ``copies_saved``: results that came back in the worker's shared memory
      and were handed over without a copy in this process (not under
      ``copy=True``; a result that travels pickled saves none);
    - ``workers_replaced``: workers that died (killed, crashed, ended) and
      were replaced;
    - ``timeouts``: calls that ran past the pool's timeout;
    - ``calls_in_kernel``: of ``calls``, those whose outputs TensorFlow's
      kernel made from the worker's reply itself (a graph's or tf.data's,
      once its route is set up); the others (eager calls, a route's first
      calls, replies that Python must convert) went through Python;
    - ``calls_failed``: calls the pool failed (their worker died or was
      ended for a timeout, or the pool closed), not in ``calls``;
    - ``bytes_out_shared`` / ``bytes_out_copied``: of the kernel's results
      (``calls_in_kernel``), the bytes handed to TensorFlow as views of the
      worker's shared memory, and those copied out of it (``copy=True``).
    """

    calls: int = 0
    seconds_queued: float = 0.0
    seconds_in_workers: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    copies_saved: int = 0
    workers_replaced: int = 0
    timeouts: int = 0
    calls_in_kernel: int = 0
    calls_failed: int = 0
    bytes_out_shared: int = 0
    bytes_out_copied: int = 0


class PoolCounters:
    """The record of one pool name, updated from any thread."""

    def __init__(self):
        self._lock = _locks.lock()
        self._routes = []  # the pools' routes (the worker module's Route)
        self.clear()

    def clear(self):
        with self._lock:
            self._counts = dataclasses.asdict(PoolStats())
            for route in self._routes:
                route.clear()

    def add_route(self, route):
        """A route whose native calls count here."""
        with self._lock:
            self._routes.append(route)

    def drop_route(self, route):
        """A route that goes: what it counted stays."""
        with self._lock:
            if route in self._routes:
                self._routes.remove(route)
                _add_route_counts(self._counts, route)

    def add(self, **counts):
        """Adds `counts` (by PoolStats field) while statistics are on (the
        pool module's switch, which pfb.enable_stats sets with the conversion
        layer's): the results of a call its route counted, decoded in Python
        (bytes_out, copies_saved); a dead worker replaced (workers_replaced);
        a call past the pool's timeout (timeouts)."""
        if pool_module().counting():
            with self._lock:
                for field, n in counts.items():
                    self._counts[field] += n

    def snapshot(self):
        with self._lock:
            counts = dict(self._counts)
            for route in self._routes:
                _add_route_counts(counts, route)
            return PoolStats(**counts)


def _add_route_counts(counts, route):
    """Adds `route`'s own counts (dispatch.h, PfbDispatchRouteCounts) to a
    record's: the one place that reads them."""
    c = route.counts()
    counts["calls"] += c["calls"]
    counts["calls_in_kernel"] += c["calls"] - c["replied"]
    counts["calls_failed"] += c["failed"]
    counts["bytes_out_shared"] += c["shared_out"]
    counts["bytes_out_copied"] += c["copied_out"]
    counts["seconds_queued"] += c["queued_ns"] / 1e9
    counts["seconds_in_workers"] += c["worker_ns"] / 1e9
    counts["bytes_in"] += c["bytes_in"]
    counts["bytes_out"] += c["bytes_out"]
    counts["copies_saved"] += c["copies_saved"]


_records = collections.defaultdict(PoolCounters)  # pool name -> PoolCounters
_records_lock = _locks.lock()


def record(name):
    """The record a pool named `name` counts into (pools of one name share it)."""
    with _records_lock:
        return _records[name]


def snapshot():
    """name -> PoolStats, for the pools with anything counted."""
    with _records_lock:
        records = list(_records.items())
    return {name: s for name, s in ((n, r.snapshot()) for n, r in records)
            if s != PoolStats()}


def reset():
    with _records_lock:
        records = list(_records.values())
    for r in records:
        r.clear()


def data_bytes(value):
    """The bytes of data `value` holds: an array's (its strings' for an
    object array), a NumPy scalar's, a bytes or str's; 0 for anything else."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "kind", None) == "O":
        return sum(data_bytes(item) for item in value.flat)
    nbytes = getattr(value, "nbytes", None)
    return nbytes if type(nbytes) is int else 0
