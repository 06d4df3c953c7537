"""Eager call overhead: pyfunc_bridge vs TF's builtins, called from Python.

Each variant calls the op N times in a Python loop on a small float32 tensor;
its overhead is the per-call time minus that of a bare eager ``Identity`` op
through TF's generated wrapper (one op dispatch, no Python operator overloads).

    python -m benchmarks.eager_overhead [--calls N] [--repeats R]
"""
import argparse

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_array_ops

from benchmarks import _timing as T

BARE = "bare eager op (Identity)"


def measure(calls, repeats, label="eager_overhead"):
    x = tf.constant(np.arange(16, dtype=np.float32))
    ops = {BARE: lambda: gen_array_ops.identity(x)}
    pairs = {}
    for family in T.families():
        for fn in T.FUNCTIONS:
            ours, theirs = f"pfb {family.name} {fn.__name__}", f"tf {family.name} {fn.__name__}"
            ops[ours] = lambda f=family.ours, fn=fn: f(fn, [x], tf.float32)
            ops[theirs] = lambda f=family.tf, fn=fn: f(fn, [x], tf.float32)
            pairs[(family.name, fn.__name__)] = (ours, theirs)

    def per_call(op):
        def run():
            loop = range(calls)
            return T.timed(lambda: [op() for _ in loop]) / calls
        return run
    runs = {name: per_call(op) for name, op in ops.items()}
    return T.alternate(runs, repeats, label), pairs


def summarize(samples, pairs):
    bare = samples[BARE]

    def overhead(name):
        return [(t - b) * 1e6 for t, b in zip(samples[name], bare)]

    cases = {f"{family} {fn}": T.add_best(T.compare(overhead(ours), overhead(theirs)),
                                          samples[ours], samples[theirs], bare)
             for (family, fn), (ours, theirs) in pairs.items()}
    per_call = {name: T.median(s) * 1e6 for name, s in samples.items()}
    return {"unit": "microseconds of overhead per eager call (per-call time minus a bare eager "
                    "Identity op); ratio = TF's overhead / ours",
            "bare_op_us": per_call[BARE], "per_call_us": per_call, "cases": cases}


def table(result):
    lines = [f"eager_overhead (us per call above a bare eager op of "
             f"{result['bare_op_us']:.2f} us; ratio = TF / ours)",
             f"  {'case':<30}{'ours':>9}{'TF':>9}{'ratio':>8}{'range':>12}"
             f"{'best: ours':>12}{'TF':>9}{'ratio':>8}"]
    for name, c in result["cases"].items():
        lines.append(f"  {name:<30}{c['ours']:>9.2f}{c['tf']:>9.2f}{c['ratio']:>7.1f}x"
                     f"{T.fmt_range(c['ratio_range']):>12}"
                     f"{c['ours_best']:>12.2f}{c['tf_best']:>9.2f}{c['ratio_best']:>7.1f}x")
    return "\n".join(lines)


# mode -> (calls per run, repetitions)
MODES = {"smoke": (50, 1), "quick": (300, 3), "full": (2000, 7)}


def run(mode="full"):
    return summarize(*measure(*MODES[mode]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(table(summarize(*measure(args.calls, args.repeats))))


if __name__ == "__main__":
    main()
