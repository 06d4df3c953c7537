"""Eager call overhead: pyfunc_bridge vs TF's builtins, called from Python.

Each variant calls the op N times in a Python loop on a small float32 tensor;
its overhead is the per-call time minus that of a bare eager ``Identity`` op
through TF's generated wrapper (one op dispatch, no Python operator overloads),
run just before and after it (T.interleaved: the same conditions for both).

    python -m benchmarks.eager_overhead [--mode smoke|quick|full]
"""
import sys

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
    return T.interleaved(runs, BARE, repeats, label), pairs


def summarize(samples, pairs):
    cases = T.overhead_cases(samples, pairs)
    per_call = {name: T.median([s.variant for s in v]) * 1e6 for name, v in samples.items()}
    per_call[BARE] = T.median([s.bare for v in samples.values() for s in v]) * 1e6
    return {"unit": "microseconds of overhead per eager call (per-call time minus the mean of "
                    "the two bare eager Identity ops run around it); ratio = TF's overhead / "
                    "ours; None: below the resolution *_below",
            "bare_op_us": per_call[BARE], "per_call_us": per_call, "cases": cases}


def table(result):
    return "\n".join(T.overhead_table(
        f"eager_overhead (us per call above a bare eager op of "
        f"{result['bare_op_us']:.2f} us; ratio = TF / ours)", result["cases"]))


# mode -> (calls per run, repetitions)
MODES = {"smoke": (50, 1), "quick": (300, 3), "full": (2000, 7)}


def run(mode="full"):
    return summarize(*measure(*MODES[mode]))


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
