"""Shared pieces of the benchmark suite: the function families compared, the
user functions, alternating timed runs, medians and ranges.

Every scenario runs ours and TF's variant in the same process, alternating,
several repetitions; the ratio of the medians (and its range over the
repetitions, each paired within one repetition) is the result.
"""
import argparse
import collections
import statistics
import sys
import time

import tensorflow as tf

import pyfunc_bridge as pfb

# One family per bridged API: (name, ours, TF's), each called as
# f(func, inp, Tout).  A family that pyfunc_bridge does not offer (yet) is
# left out; adding one is one line here.
Family = collections.namedtuple("Family", ["name", "ours", "tf"])
_FAMILIES = [
    ("numpy_function", "numpy_function", tf.numpy_function),
    ("py_function", "py_function", tf.py_function),
]


def families():
    """The families pyfunc_bridge implements, in report order."""
    return [Family(name, getattr(pfb, attr), theirs)
            for name, attr, theirs in _FAMILIES if hasattr(pfb, attr)]


def identity(a):
    """Returns its input: a view of TF's memory (pass-through)."""
    return a


def plus_one(a):
    """Returns a fresh array."""
    return a + 1


def times_two(a):
    """Returns a fresh array of the input's size."""
    return a * 2


def a_plus_b(a, b):
    """Adds its two inputs: a fresh array (py_function: one eager TF op).  The
    loops feed each result to the next call, so they start from zeros: the
    sums never grow."""
    return a + b


FUNCTIONS = (identity, plus_one)
# Functions of two inputs: the scenarios that run them pass the tensor twice.
TWO_INPUT_FUNCTIONS = (a_plus_b,)


def progress(message):
    print(message, file=sys.stderr, flush=True)


def timed(run):
    """Seconds that `run()` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def alternate(runs, repeats, label=None):
    """name -> samples: each repetition calls every run once, in order.

    `runs`: name -> callable returning the value measured (seconds, or any
    number).  Each is called once before the first repetition (tracing,
    warm-up).
    """
    for run in runs.values():
        run()
    samples = {name: [] for name in runs}
    for r in range(repeats):
        for name, run in runs.items():
            samples[name].append(run())
        if label:
            progress(f"  {label}: repetition {r + 1}/{repeats}")
    return samples


def median(values):
    return statistics.median(values)


def span(values):
    return [min(values), max(values)]


def safe_ratio(a, b):
    return a / b if b > 0 else float("inf")


def compare(ours, theirs, higher_is_better=False):
    """{ours, tf, ratio, ratio_range} from paired samples.

    ratio: how many times better ours is (TF's cost / ours, or ours'
    throughput / TF's); ratio_range: over the repetitions.
    """
    if higher_is_better:
        ratios = [safe_ratio(o, t) for o, t in zip(ours, theirs)]
        ratio = safe_ratio(median(ours), median(theirs))
    else:
        ratios = [safe_ratio(t, o) for o, t in zip(ours, theirs)]
        ratio = safe_ratio(median(theirs), median(ours))
    return {"ours": median(ours), "tf": median(theirs), "ratio": ratio,
            "ours_range": span(ours), "tf_range": span(theirs), "ratio_range": span(ratios)}


def add_best(case, ours, theirs, bare):
    """Adds the overheads of the best (fastest) runs: min(variant) - min(bare).

    On a machine shared with other work the fastest run is the one least
    disturbed, so this ratio is the steadier of the two; the medians stay the
    headline figures.
    """
    case["ours_best"] = (min(ours) - min(bare)) * 1e6
    case["tf_best"] = (min(theirs) - min(bare)) * 1e6
    case["ratio_best"] = safe_ratio(case["tf_best"], case["ours_best"])
    return case


def fmt_range(values, digits=1):
    lo, hi = values
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


def graph_loop(body):
    """A tf.function running `body` n times in a ``tf.range`` loop, each
    output (given the input's static shape) feeding the next call."""
    @tf.function
    def run(x, n):
        for _ in tf.range(n):
            y = body(x)
            y.set_shape(x.shape)
            x = y
        return x
    return run


def overhead_us(samples, name, bare):
    """Per-repetition overhead of `name` over the bare variant, in us."""
    return [(t - b) * 1e6 for t, b in zip(samples[name], samples[bare])]


def overhead_cases(samples, pairs, bare):
    """'family function' -> ours/TF overheads, ratio, ranges and best runs."""
    return {f"{family} {fn}": add_best(
                compare(overhead_us(samples, ours, bare), overhead_us(samples, theirs, bare)),
                samples[ours], samples[theirs], samples[bare])
            for (family, fn), (ours, theirs) in pairs.items()}


def overhead_table(title, cases):
    lines = [title,
             f"  {'case':<30}{'ours':>9}{'TF':>9}{'ratio':>8}{'range':>12}"
             f"{'best: ours':>12}{'TF':>9}{'ratio':>8}"]
    for name, c in cases.items():
        lines.append(f"  {name:<30}{c['ours']:>9.2f}{c['tf']:>9.2f}{c['ratio']:>7.1f}x"
                     f"{fmt_range(c['ratio_range']):>12}"
                     f"{c['ours_best']:>12.2f}{c['tf_best']:>9.2f}{c['ratio_best']:>7.1f}x")
    return lines


def scenario_main(module, argv=None):
    """``python -m benchmarks.<scenario> [--mode smoke|quick|full]``."""
    parser = argparse.ArgumentParser(description=module.__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=list(module.MODES), default="full")
    args = parser.parse_args(argv)
    print(module.table(module.run(args.mode)))
