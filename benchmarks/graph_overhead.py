"""Per-call overhead inside a graph: pyfunc_bridge vs TF's builtins.

Each variant runs N iterations of a ``tf.range`` loop inside one tf.function;
the loop body applies the op to a small float32 tensor (16 elements).  The
overhead of a bridge is its per-iteration time minus that of a bare
``x * 1.0`` loop, so the loop itself is not counted.  Three user functions:
`identity` (returns a view of TF's memory), `plus_one` (a fresh array) and
`a_plus_b` (two inputs, the tensor twice; for py_function one eager TF op).
The statistics' own cost is measured too: pfb identity with counting forced
on and off, run on, off, off, on in each repetition.

Each run of a variant is bracketed by two runs of the bare loop, and its
overhead is its time minus their mean (T.interleaved): both are measured
under the same conditions, and a bracket the machine disturbed is measured
again.  An overhead the noise still outweighs is printed as a bound ("<x",
and the ratio as ">y"), never as a negative figure.

    python -m benchmarks.graph_overhead [--mode smoke|quick|full]
"""
import contextlib
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

BARE = "bare op (x * 1.0)"
# The statistics' cost: the same op with counting forced on and off.
STATS_ON = "pfb numpy_function identity, stats on"
STATS_OFF = "pfb numpy_function identity, stats off"


def variants():
    """name -> loop body; (family, function) -> (ours' name, TF's name)."""
    bodies = {BARE: lambda x: x * 1.0}
    pairs = {}
    for family in T.families():
        for fn, arity in ([(fn, 1) for fn in T.FUNCTIONS]
                          + [(fn, 2) for fn in T.TWO_INPUT_FUNCTIONS]):
            ours = f"pfb {family.name} {fn.__name__}"
            theirs = f"tf {family.name} {fn.__name__}"
            bodies[ours] = lambda x, f=family.ours, fn=fn, k=arity: f(fn, [x] * k, tf.float32)
            bodies[theirs] = lambda x, f=family.tf, fn=fn, k=arity: f(fn, [x] * k, tf.float32)
            pairs[(family.name, fn.__name__)] = (ours, theirs)
    for name in (STATS_ON, STATS_OFF):
        bodies[name] = lambda x: pfb.numpy_function(T.identity, [x], tf.float32)
    return bodies, pairs


def measure(iterations, repeats, label="graph_overhead"):
    """name -> one T.Bracketed sample (seconds per iteration) per repetition."""
    # Zeros: each result feeds the next call, and a_plus_b doubles its input.
    x = tf.zeros([16], tf.float32)
    bodies, pairs = variants()
    runs = T.loop_runs(bodies, x, iterations, scope=_counting)
    compared = [name for name in runs if name not in (BARE, STATS_ON, STATS_OFF)]
    return T.interleaved(runs, BARE, repeats, label, order=lambda r: _abba(compared)), pairs


@contextlib.contextmanager
def _counting(name):
    """The statistics forced on or off for the two A/B variants."""
    counting = {STATS_ON: True, STATS_OFF: False}.get(name)
    previous = pfb.enable_stats(counting) if counting is not None else None
    try:
        yield
    finally:
        if counting is not None:
            pfb.enable_stats(previous)


def _abba(compared):
    """One repetition's order: the compared variants, then the statistics A/B
    as on, off, off, on (each sample the mean of its two runs): whichever
    setting runs first pays for following the TF variants (about 5% in quick
    mode, measured by swapping the two), which a fixed order would count as
    the statistics' cost or gain."""
    return compared + [STATS_ON, STATS_OFF, STATS_OFF, STATS_ON]


def summarize(samples, pairs):
    """results.json's graph_overhead: per case ours/TF overhead (us) and ratio."""
    cases = T.overhead_cases(samples, pairs)
    stats = T.overhead_case(samples, STATS_OFF, STATS_ON)  # "TF" / "ours" = on / off
    bare = [s.bare for name in samples for s in samples[name]]
    return {
        "unit": "microseconds of overhead per call (per-iteration time minus the mean of the "
                "two bare x * 1.0 loops run around it); ratio = TF's overhead / ours; None: "
                "below the resolution *_below",
        "bare_op_us": T.median(bare) * 1e6,
        "cases": cases,
        "stats_cost": {
            "stats_on_us": stats["tf"], "stats_on_below": stats["tf_below"],
            "stats_off_us": stats["ours"], "stats_off_below": stats["ours_below"],
            "on_over_off": stats["ratio"], "on_over_off_range": stats["ratio_range"],
            "best_on_us": stats["tf_best"], "best_on_below": stats["tf_best_below"],
            "best_off_us": stats["ours_best"], "best_off_below": stats["ours_best_below"],
            "best_on_over_off": stats["ratio_best"],
        },
    }


def table(result):
    lines = T.overhead_table(f"graph_overhead (us per call above a bare op of "
                             f"{result['bare_op_us']:.2f} us; ratio = TF / ours)",
                             result["cases"])
    s = result["stats_cost"]
    ratio = (f"{s['on_over_off']:.2f}x" if s["on_over_off"] is not None else "n/a")
    span = (T.fmt_range(s["on_over_off_range"], 2) if s["on_over_off_range"] else "n/a")
    best = (f"{s['best_on_over_off']:.2f}x" if s["best_on_over_off"] is not None else "n/a")
    lines.append(f"  statistics on/off (numpy_function identity): "
                 f"{T.fmt_us(s['stats_on_us'], s['stats_on_below'])} / "
                 f"{T.fmt_us(s['stats_off_us'], s['stats_off_below'])} us = {ratio} "
                 f"(range {span}); best runs {T.fmt_us(s['best_on_us'], s['best_on_below'])} / "
                 f"{T.fmt_us(s['best_off_us'], s['best_off_below'])} us = {best}")
    return "\n".join(lines)


# mode -> (iterations per run, repetitions)
MODES = {"smoke": (300, 1), "quick": (3000, 3), "full": (20000, 7)}


def run(mode="full"):
    samples, pairs = measure(*MODES[mode])
    return summarize(samples, pairs)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
