"""Shared pieces of the benchmark suite: the function families compared, the
user functions, alternating timed runs, medians and ranges.

Every scenario runs ours and TF's variant in the same process, alternating,
several repetitions; the ratio of the medians (and its range over the
repetitions, each paired within one repetition) is the result.
"""
import argparse
import collections
import contextlib
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


# A variant's run bracketed by two runs of the bare op (bare, variant, bare):
# `bare` is their mean, `drift` how far apart they were.
Bracketed = collections.namedtuple("Bracketed", ["variant", "bare", "drift"])


def interleaved(runs, bare, repeats, label=None, order=None, tolerance=0.05, attempts=5):
    """name -> one Bracketed sample per repetition: each run of a variant is
    measured between two runs of `bare`, so that the overhead (variant minus
    bare) compares runs made under the same conditions.

    A bracket was disturbed (the machine changed speed during it) when its
    two bare runs differ by more than `tolerance` of their mean, or when the
    variant ran faster than the bare op it adds work to; it is measured
    again, up to `attempts` times in all, and the least disturbed attempt is
    kept.  `order(r)`: the names measured in repetition r (a name may come
    twice: its sample is then the mean of its brackets); default: all, in
    the order of `runs`.  Every run is called once first (tracing, warm-up).
    """
    bare_run = runs[bare]
    for run in runs.values():
        run()
    samples = {name: [] for name in runs if name != bare}

    def bracket(run):
        tried = []
        for _ in range(attempts):
            before, value, after = bare_run(), run(), bare_run()
            mean = (before + after) / 2
            taken = Bracketed(value, mean, abs(after - before))
            if taken.drift <= tolerance * mean and value > mean:
                return taken
            tried.append(taken)
        # None undisturbed: the one whose bare runs agreed best, preferring
        # those where the variant was not faster than the bare op.
        return min(tried, key=lambda t: (t.variant <= t.bare, t.drift))

    for r in range(repeats):
        names = order(r) if order else list(samples)
        taken = {}
        for name in names:
            taken.setdefault(name, []).append(bracket(runs[name]))
        for name, brackets in taken.items():
            samples[name].append(Bracketed(*(sum(field) / len(brackets)
                                             for field in zip(*brackets))))
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


def loop_runs(bodies, x, iterations, scope=lambda name: contextlib.nullcontext()):
    """name -> a run timing `iterations` iterations of the body's graph_loop
    on `x` (seconds per iteration; the result is fetched, so a GPU's work is
    done), each run inside `scope(name)`.  Each loop is traced first."""
    n = tf.constant(iterations)
    runs = {}
    for name, body in bodies.items():
        loop = graph_loop(body)
        with scope(name):
            loop(x, tf.constant(2))  # trace

        def run(loop=loop, name=name):
            with scope(name):
                return timed(lambda: loop(x, n).numpy()) / iterations
        runs[name] = run
    return runs


def overhead_us(samples, name):
    """Per-repetition overhead of `name` over its bracketing bare runs, in us."""
    return [(s.variant - s.bare) * 1e6 for s in samples[name]]


def resolution_us(samples, name):
    """What the bare op drifted between the two runs that bracket `name`
    (median over repetitions, in us): overheads below it are not measured."""
    return max(median([s.drift for s in samples[name]]) * 1e6, 0.01)


def overhead(values, resolution):
    """{value, below}: the median overhead, or (when the median is not above
    0: the noise outweighed it) None and the resolution it is below."""
    value = median(values)
    return {"value": value, "below": None} if value > 0 else {"value": None,
                                                             "below": resolution}


def overhead_ratio(tf_over, ours_over):
    """TF's overhead / ours, or a lower bound ({"above": ...}) where ours is
    below the resolution; None where TF's is."""
    if tf_over["value"] is None:
        return {"value": None, "above": None}
    if ours_over["value"] is None:
        return {"value": None, "above": tf_over["value"] / ours_over["below"]}
    return {"value": tf_over["value"] / ours_over["value"], "above": None}


def overhead_case(samples, ours, theirs):
    """ours/TF overheads (us), their ratio, its range over the repetitions
    (those where both overheads are measured) and the same from the best
    (fastest) runs: on a machine shared with other work the fastest run is
    the least disturbed.  An overhead the noise outweighed is None, with
    *_below: the resolution it is below; the ratio is then None, with
    ratio_above: the bound it is above."""
    ours_us, tf_us = overhead_us(samples, ours), overhead_us(samples, theirs)
    resolution = {name: resolution_us(samples, name) for name in (ours, theirs)}
    ours_over = overhead(ours_us, resolution[ours])
    tf_over = overhead(tf_us, resolution[theirs])
    ratio = overhead_ratio(tf_over, ours_over)
    both = [t / o for o, t in zip(ours_us, tf_us) if o > 0 and t > 0]

    def fastest(name, values):
        i = min(range(len(values)), key=lambda i: samples[name][i].variant)
        return overhead([values[i]], resolution[name])
    ours_best, tf_best = fastest(ours, ours_us), fastest(theirs, tf_us)
    ratio_best = overhead_ratio(tf_best, ours_best)
    return {"ours": ours_over["value"], "ours_below": ours_over["below"],
            "tf": tf_over["value"], "tf_below": tf_over["below"],
            "ratio": ratio["value"], "ratio_above": ratio["above"],
            "ratio_range": span(both) if both else None,
            "ours_best": ours_best["value"], "ours_best_below": ours_best["below"],
            "tf_best": tf_best["value"], "tf_best_below": tf_best["below"],
            "ratio_best": ratio_best["value"], "ratio_best_above": ratio_best["above"]}


def overhead_cases(samples, pairs):
    """'family function' -> overhead_case of its (ours, TF's) variants."""
    return {f"{family} {fn}": overhead_case(samples, ours, theirs)
            for (family, fn), (ours, theirs) in pairs.items()}


def fmt_us(value, below, digits=2):
    """An overhead in us, or "<resolution" where the noise outweighed it."""
    return f"{value:.{digits}f}" if value is not None else f"<{below:.{digits}f}"


def fmt_ratio(value, above, digits=1):
    if value is not None:
        return f"{value:.{digits}f}x"
    return f">{above:.{digits}f}x" if above is not None else "n/a"


def overhead_table(title, cases):
    lines = [title,
             f"  {'case':<30}{'ours':>9}{'TF':>9}{'ratio':>8}{'range':>12}"
             f"{'best: ours':>12}{'TF':>9}{'ratio':>8}"]
    for name, c in cases.items():
        span_text = fmt_range(c["ratio_range"]) if c["ratio_range"] else "n/a"
        lines.append(f"  {name:<30}{fmt_us(c['ours'], c['ours_below']):>9}"
                     f"{fmt_us(c['tf'], c['tf_below']):>9}"
                     f"{fmt_ratio(c['ratio'], c['ratio_above']):>8}{span_text:>12}"
                     f"{fmt_us(c['ours_best'], c['ours_best_below']):>12}"
                     f"{fmt_us(c['tf_best'], c['tf_best_below']):>9}"
                     f"{fmt_ratio(c['ratio_best'], c['ratio_best_above']):>8}")
    if any(c["ratio"] is None for c in cases.values()):
        lines.append("  (<x: an overhead below the resolution x, how far the bare op drifted "
                     "between the two runs around it; >y: the ratio's lower bound)")
    return lines


def scenario_main(module, argv=None):
    """``python -m benchmarks.<scenario> [--mode smoke|quick|full]``."""
    parser = argparse.ArgumentParser(description=module.__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=list(module.MODES), default="full")
    args = parser.parse_args(argv)
    print(module.table(module.run(args.mode)))
