"""A pfb call inside an XLA-compiled loop against the same call in a plain
tf.function (not part of ``python -m benchmarks``' default set).

Both loops run N iterations of ``x = numpy_function(negative, [x])`` on 16
floats (``Tout=tf.TensorSpec([16], tf.float32)``, as XLA needs), one in
``tf.function(jit_compile=True)``, where the call is an XLA custom call, one
in a plain ``tf.function``, where it is the op's kernel.  Each variant's bare
loop (``x = -x``, compiled the same way) is timed just before it and
subtracted: what is left is the call's cost.  In the table "ours" is the XLA
loop and "tf" the plain tf.function; ratio = plain / XLA (above 1: the call
costs less under XLA).

    python -m benchmarks.xla_loop [--mode smoke|quick|full]
"""
import math
import sys

import numpy as np
import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

SPEC = tf.TensorSpec([16], tf.float32)


def _loop(body, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def run(x, n):
        return tf.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, body(x)), [0, x])[1]
    return run


def measure(calls, repeats, label="xla_loop"):
    """variant -> per-call seconds (bare loop subtracted), one per repetition."""
    x = tf.ones([16])
    n = tf.constant(calls)
    call = lambda v: pfb.numpy_function(np.negative, [v], SPEC)  # noqa: E731
    loops = {}
    for name, jit_compile in (("xla", True), ("plain", False)):
        loops[name] = _loop(call, jit_compile)
        loops[name + " bare"] = _loop(lambda v: -v, jit_compile)
    runs = {name: (lambda loop=loop: T.timed(lambda: loop(x, n).numpy()))
            for name, loop in loops.items()}
    samples = T.alternate(runs, repeats, label)
    return {name: [max(v - b, 0.0) / calls
                   for v, b in zip(samples[name], samples[name + " bare"])]
            for name in ("xla", "plain")}


def summarize(samples):
    us = {name: [v * 1e6 for v in s] for name, s in samples.items()}
    return {"unit": "us per call above the bare loop; ours = jit_compile=True, "
                    "tf = plain tf.function; ratio = plain / XLA",
            "cases": {"numpy_function negative 16 floats": T.compare(us["xla"], us["plain"])}}


def table(result):
    c = result["cases"]["numpy_function negative 16 floats"]
    # An overhead the noise outweighed measures 0 above the bare loop (a short
    # run on a busy machine): no ratio then, rather than inf or 0.
    measured = c["ours"] > 0 and c["tf"] > 0 and all(0 < r < math.inf for r in c["ratio_range"])
    ratio = (f"{c['ratio']:.2f} (range {T.fmt_range(c['ratio_range'], 2)})" if measured
             else "n/a (an overhead below the noise)")
    return ("xla_loop (a pfb call per iteration, us above the bare loop)\n"
            f"  jit_compile=True {c['ours']:.2f} us, plain tf.function {c['tf']:.2f} us, "
            f"plain / XLA {ratio}")


# mode -> (calls per run, repetitions)
MODES = {"smoke": (50, 1), "quick": (2000, 3), "full": (20000, 5)}


def run(mode="full"):
    return summarize(measure(*MODES[mode]))


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
