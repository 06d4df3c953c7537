"""Runtime statistics: what each bridged function cost and whether it copied.

The conversion layer counts every call of every bridge op while counting is
on (it is on by default); these functions switch, read and clear the counters.

>>> import numpy as np, tensorflow as tf
>>> import pyfunc_bridge as pfb
>>> previous = pfb.enable_stats(True)
>>> pfb.reset_stats()
>>> _ = pfb.numpy_function(lambda a: a * 2, [tf.zeros([256])], tf.float32, name="double")
>>> snapshot = pfb.stats()
>>> entry = snapshot.functions["double"]
>>> entry.calls, entry.bytes_zero_copy, entry.bytes_copied["shared_input"]
(1, 1024, 1024)
>>> snapshot.total.calls
1
>>> _ = pfb.enable_stats(previous)

Calls run by a ProcessPool are counted per function as any other, and per
pool (``snapshot.pools``, by the pool's name):

>>> pfb.reset_stats()
>>> with pfb.ProcessPool(1, name="adding pool") as pool:
...     _ = pfb.numpy_function(np.add, [tf.zeros([256]), tf.ones([256])], tf.float32,
...                            executor=pool)
>>> pool_stats = pfb.stats().pools["adding pool"]
>>> pool_stats.calls, pool_stats.bytes_in, pool_stats.bytes_out, pool_stats.copies_saved
(1, 2048, 1024, 1)
"""
import dataclasses
import sys

from pyfunc_bridge import _library


def _copy_reasons():
    """The conversion layer's COPY_REASONS (src/conversion/copy.pxi)."""
    return _library.conversion().COPY_REASONS


@dataclasses.dataclass(frozen=True)
class FunctionStats:
    """Counters of one function (or the total over all of them).

    Bytes count inputs and outputs.  ``bytes_zero_copy``: handed across without
    a copy; ``bytes_copied``: reason -> bytes copied (or converted) for that
    reason, one of the conversion layer's ``COPY_REASONS``:

    - ``unaligned``: an output whose data is not 64-byte aligned;
    - ``non_contiguous``: an output that is not C-contiguous;
    - ``aliasing``: an output whose memory Python can still reach;
    - ``dtype_conversion``: Python scalars and lists converted to the declared
      dtype, and py_function's NumPy results of another dtype converted to it;
    - ``string``: tf.string data (always converted, both ways);
    - ``copy_requested``: ``copy=True`` inputs and outputs;
    - ``lazy_view``: torch's lazy conjugate / negative views, resolved into
      new tensors (their memory does not hold the values they read as).

    ``seconds_in_function``: time in the Python function;
    ``seconds_marshalling``: time in the conversion layer around it.
    """

    calls: int = 0
    errors: int = 0
    bytes_zero_copy: int = 0
    bytes_copied: dict = dataclasses.field(
        default_factory=lambda: dict.fromkeys(_copy_reasons(), 0))
    seconds_in_function: float = 0.0
    seconds_marshalling: float = 0.0

    @property
    def bytes_copied_total(self):
        return sum(self.bytes_copied.values())


def _add(a, b):
    return FunctionStats(
        a.calls + b.calls, a.errors + b.errors, a.bytes_zero_copy + b.bytes_zero_copy,
        {r: a.bytes_copied[r] + b.bytes_copied[r] for r in _copy_reasons()},
        a.seconds_in_function + b.seconds_in_function,
        a.seconds_marshalling + b.seconds_marshalling)


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@dataclasses.dataclass(frozen=True)
class StatsSnapshot:
    """``functions``: name -> FunctionStats, keyed by the op's ``name=`` or
    else the function's ``__qualname__``; ``total``: their sum; ``enabled``:
    whether counting was on when the snapshot was taken.

    ``pools``: pool name -> PoolStats (pyfunc_bridge/pool/statistics.py), for
    the ProcessPools with calls or faults counted.

    ``eager_tensor_path``: how py_function's kernel turns its TF tensors into
    the function's EagerTensors and the results back: ``"kernel"`` (directly,
    through TensorFlow's own exports) or ``"dlpack"`` (through DLPack, slower
    per call, when the installed TensorFlow lacks an export the direct path
    needs); ``eager_tensor_missing``: the names of those exports.
    """

    functions: dict
    total: FunctionStats
    enabled: bool
    eager_tensor_path: str = "kernel"
    eager_tensor_missing: tuple = ()
    pools: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        columns = [("function", "<"), ("calls", ">"), ("errors", ">"), ("zero-copy", ">"),
                   ("copied", ">"), ("in function", ">"), ("marshalling", ">"),
                   ("copied by reason", "<")]
        rows = []
        for name, s in sorted(self.functions.items()) + [("(total)", self.total)]:
            reasons = ", ".join(f"{r} {_bytes(n)}" for r, n in s.bytes_copied.items() if n)
            per_call = 1e6 / s.calls if s.calls else 0.0
            rows.append([name[:48], str(s.calls), str(s.errors), _bytes(s.bytes_zero_copy),
                         _bytes(s.bytes_copied_total),
                         f"{s.seconds_in_function * per_call:.2f} us",
                         f"{s.seconds_marshalling * per_call:.2f} us", reasons or "-"])
        lines = _table(columns, rows)
        lines.append("(times are per call; statistics are "
                     f"{'on' if self.enabled else 'off'})")
        if self.pools:
            lines.extend(_pool_table(self.pools))
        if self.eager_tensor_missing:
            lines.append("(py_function's EagerTensors go through DLPack: TensorFlow does "
                         f"not export {', '.join(self.eager_tensor_missing)})")
        return "\n".join(lines)


def _pool_table(pools):
    columns = [("pool", "<"), ("calls", ">"), ("queued", ">"), ("in worker", ">"),
               ("bytes in", ">"), ("bytes out", ">"), ("copies saved", ">"),
               ("replaced", ">"), ("timeouts", ">")]
    rows = []
    for name, p in sorted(pools.items()):
        per_call = 1e6 / p.calls if p.calls else 0.0
        rows.append([name[:48], str(p.calls), f"{p.seconds_queued * per_call:.1f} us",
                     f"{p.seconds_in_workers * per_call:.1f} us", _bytes(p.bytes_in),
                     _bytes(p.bytes_out), str(p.copies_saved), str(p.workers_replaced),
                     str(p.timeouts)])
    return ["", *_table(columns, rows), "(pool times are per call)"]


def _table(columns, rows):
    """The lines of a table of `columns` ((title, "<" or ">") pairs) and `rows`
    (lists of strings): each column as wide as its widest cell, two spaces
    between columns, so that wide numbers never run together."""
    widths = [max(len(title), *(len(row[i]) for row in rows))
              for i, (title, _) in enumerate(columns)]

    def line(cells):
        return "  ".join(f"{cell:{align}{width}}" for cell, (_, align), width
                         in zip(cells, columns, widths)).rstrip()

    header = line([title for title, _ in columns])
    return [header, "-" * len(header), *(line(row) for row in rows)]


def stats():
    """A snapshot of the counters of every function called since the last reset.

    Returns:
      StatsSnapshot with ``.functions`` (name -> FunctionStats) and ``.total``;
      ``.pools`` (pool name -> PoolStats: ``calls``, ``seconds_queued``,
      ``seconds_in_workers``, ``bytes_in``, ``bytes_out``, ``copies_saved``,
      ``workers_replaced``, ``timeouts``, and which way the calls went:
      ``calls_in_kernel``, ``calls_failed``, ``bytes_out_shared``,
      ``bytes_out_copied``) for the ProcessPools that ran calls
      (pools of one name share a record; a closed pool's stays until
      reset); ``str()`` of it is a table.  ``.eager_tensor_path`` says how
      py_function's EagerTensors are made (``"kernel"``: directly).
    """
    conversion = _library.conversion()
    functions = {}
    for name, (calls, errors, zero_copy, copied, in_function, marshalling) in (
            conversion.stats_snapshot().items()):
        functions[name] = FunctionStats(
            calls, errors, zero_copy, dict(zip(conversion.COPY_REASONS, copied)),
            in_function, marshalling)
    total = FunctionStats()
    for entry in functions.values():
        total = _add(total, entry)
    missing = _library.eager_api_missing()
    return StatsSnapshot(functions, total, conversion.stats_enabled(),
                         "dlpack" if missing else "kernel", missing, _pools("snapshot", {}))


def reset_stats():
    """Clears every function's and every pool's counters."""
    _library.conversion().reset_stats()
    _pools("reset", None)


def _pools(what, none):
    """`what` of the pools' statistics (pool/statistics.py), or `none` while no pool
    was used: that module loads with the pool's (import stays cheap)."""
    pool_stats = sys.modules.get("pyfunc_bridge.pool.statistics")
    return none if pool_stats is None else getattr(pool_stats, what)()


def enable_stats(flag=True):
    """Switches counting on (``True``) or off; returns the previous setting.

    Counting is on by default: it costs a few percent of the bridge's per-call
    overhead (``python -m benchmarks`` measures it: graph_overhead's
    statistics on/off).

    >>> import pyfunc_bridge as pfb
    >>> previous = pfb.enable_stats(False)
    >>> pfb.stats().enabled
    False
    >>> _ = pfb.enable_stats(previous)
    """
    previous = _library.conversion().enable_stats(bool(flag))
    # The pool counts by its own module's switch (dispatch.h), which it reads
    # rather than calling up into the conversion layer: both are set here.
    from pyfunc_bridge.worker.compiled import pool_module
    pool_module().set_counting(bool(flag))
    return previous
