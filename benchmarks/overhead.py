"""Per-call overhead inside a graph: pyfunc_bridge vs tf.numpy_function.

Each variant runs N iterations of a ``tf.range`` loop inside one tf.function;
the loop body applies the op to a small float32 tensor.  The overhead of a
bridge is its per-iteration time minus that of a bare ``x * 1.0`` loop.  The
variants alternate over several repetitions and the medians are reported, so
the ratio (TF's overhead / ours) is the result, not the absolute times.

    python -m benchmarks.overhead [--iterations N] [--repeats R]
"""
import argparse
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

import pyfunc_bridge as pfb


def identity(a):
    return a


def plus_one(a):
    return a + 1


def _loop(body):
    @tf.function
    def run(x, n):
        for _ in tf.range(n):
            y = body(x)
            y.set_shape(x.shape)
            x = y
        return x
    return run


BARE = "bare op (x * 1.0)"
# (bridge, function) -> loop body.  Two functions: `identity` returns its input
# (a view of TF memory), `plus_one` a fresh array (memory NumPy allocated).
VARIANTS = {BARE: lambda x: x * 1.0}
for _fn in (identity, plus_one):
    VARIANTS[f"tf.numpy_function {_fn.__name__}"] = (
        lambda x, fn=_fn: tf.numpy_function(fn, [x], tf.float32))
    VARIANTS[f"pfb.numpy_function {_fn.__name__}"] = (
        lambda x, fn=_fn: pfb.numpy_function(fn, [x], tf.float32))


def measure(iterations, repeats, progress=None):
    """Median seconds per iteration for each variant (alternating runs)."""
    x = tf.constant(np.arange(16, dtype=np.float32))
    loops = {name: _loop(body) for name, body in VARIANTS.items()}
    for run in loops.values():  # trace and warm up
        run(x, tf.constant(10))
    samples = {name: [] for name in loops}
    n = tf.constant(iterations)
    for r in range(repeats):
        for name, run in loops.items():
            start = time.perf_counter()
            run(x, n)
            samples[name].append((time.perf_counter() - start) / iterations)
        if progress:
            progress(f"graph overhead: repetition {r + 1}/{repeats}")
    return {name: statistics.median(s) for name, s in samples.items()}


def report(medians):
    """A table and, per function, {ours_us, tf_us, bare_us, ratio}."""
    bare = medians[BARE]
    lines = [f"{'variant':<32}{'per call':>12}{'overhead':>12}"]
    for name, t in medians.items():
        lines.append(f"{name:<32}{t * 1e6:>10.2f}us{(t - bare) * 1e6:>10.2f}us")
    results = {}
    for fn in (identity, plus_one):
        ours = medians[f"pfb.numpy_function {fn.__name__}"] - bare
        theirs = medians[f"tf.numpy_function {fn.__name__}"] - bare
        ratio = theirs / ours if ours > 0 else float("inf")
        lines.append(f"overhead ratio tf.numpy_function / pfb.numpy_function, "
                     f"{fn.__name__}: {ratio:.1f}x")
        results[fn.__name__] = {"ours_us": ours * 1e6, "tf_us": theirs * 1e6,
                                "bare_us": bare * 1e6, "ratio": ratio}
    return "\n".join(lines), results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    medians = measure(args.iterations, args.repeats,
                      progress=lambda s: print(s, file=sys.stderr, flush=True))
    text, _ = report(medians)
    print(text)


if __name__ == "__main__":
    main()
