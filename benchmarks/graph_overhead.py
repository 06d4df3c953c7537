"""Per-call overhead inside a graph: pyfunc_bridge vs TF's builtins.

Each variant runs N iterations of a ``tf.range`` loop inside one tf.function;
the loop body applies the op to a small float32 tensor (16 elements).  The
overhead of a bridge is its per-iteration time minus that of a bare
``x * 1.0`` loop, so the loop itself is not counted.  Three user functions:
`identity` (returns a view of TF's memory), `plus_one` (a fresh array) and
`a_plus_b` (two inputs, the tensor twice; for py_function one eager TF op).
The statistics' own cost is measured too: pfb identity with counting forced
on and off, run on, off, off, on in each repetition.

    python -m benchmarks.graph_overhead [--mode smoke|quick|full]
"""
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
    """name -> seconds per iteration, one sample per repetition."""
    # Zeros: each result feeds the next call, and a_plus_b doubles its input.
    x = tf.zeros([16], tf.float32)
    n = tf.constant(iterations)
    bodies, pairs = variants()
    runs = {}
    for name, body in bodies.items():
        loop = T.graph_loop(body)
        loop(x, tf.constant(2))  # trace

        def run(loop=loop, counting={STATS_ON: True, STATS_OFF: False}.get(name)):
            previous = pfb.enable_stats(counting) if counting is not None else None
            try:
                return T.timed(lambda: loop(x, n)) / iterations
            finally:
                if counting is not None:
                    pfb.enable_stats(previous)
        runs[name] = run
    _abba(runs)
    return T.alternate(runs, repeats, label), pairs


def _abba(runs):
    """The statistics A/B in the order on, off, off, on within each repetition
    (each sample the mean of its two runs): whichever setting runs first pays
    for following the TF variants (about 5% in quick mode, measured by
    swapping the two), which a fixed order would count as the statistics'
    cost or gain."""
    on, off = runs[STATS_ON], runs[STATS_OFF]
    pending = []

    def run_on():
        first_on, first_off, second_off, second_on = on(), off(), off(), on()
        pending.append((first_off + second_off) / 2)
        return (first_on + second_on) / 2

    runs[STATS_ON] = run_on
    runs[STATS_OFF] = pending.pop  # run right after run_on (T.alternate keeps the order)


def summarize(samples, pairs):
    """results.json's graph_overhead: per case ours/TF overhead (us) and ratio."""
    bare = samples[BARE]
    cases = T.overhead_cases(samples, pairs, BARE)
    stats_on = T.overhead_us(samples, STATS_ON, BARE)
    stats_off = T.overhead_us(samples, STATS_OFF, BARE)
    best_on = (min(samples[STATS_ON]) - min(bare)) * 1e6
    best_off = (min(samples[STATS_OFF]) - min(bare)) * 1e6
    return {
        "unit": "microseconds of overhead per call (per-iteration time minus a bare x * 1.0 "
                "loop); ratio = TF's overhead / ours",
        "bare_op_us": T.median(bare) * 1e6,
        "cases": cases,
        "stats_cost": {
            "stats_on_us": T.median(stats_on), "stats_off_us": T.median(stats_off),
            "on_over_off": T.safe_ratio(T.median(stats_on), T.median(stats_off)),
            "on_over_off_range": T.span([T.safe_ratio(a, b)
                                         for a, b in zip(stats_on, stats_off)]),
            "best_on_us": best_on, "best_off_us": best_off,
            "best_on_over_off": T.safe_ratio(best_on, best_off),
        },
    }


def table(result):
    lines = T.overhead_table(f"graph_overhead (us per call above a bare op of "
                             f"{result['bare_op_us']:.2f} us; ratio = TF / ours)",
                             result["cases"])
    s = result["stats_cost"]
    lines.append(f"  statistics on/off (numpy_function identity): {s['stats_on_us']:.2f} / "
                 f"{s['stats_off_us']:.2f} us = {s['on_over_off']:.2f}x "
                 f"(range {T.fmt_range(s['on_over_off_range'], 2)}); best runs "
                 f"{s['best_on_us']:.2f} / {s['best_off_us']:.2f} us = {s['best_on_over_off']:.2f}x")
    return "\n".join(lines)


# mode -> (iterations per run, repetitions)
MODES = {"smoke": (300, 1), "quick": (3000, 3), "full": (20000, 7)}


def run(mode="full"):
    samples, pairs = measure(*MODES[mode])
    return summarize(samples, pairs)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
