"""Per-call time against tensor size, 16 B to 64 MiB (float32, in-graph).

Two user functions: pass-through (`identity`, returns its input) and fresh
output (`times_two`, returns ``a * 2``).  Each variant runs N calls in a
``tf.range`` loop inside one tf.function, the output feeding the next call.

What "flat" means: with nothing copied, the bridge's cost must not grow with
the size.  For a fresh output the NumPy work (``a * 2``: allocating and
writing the result) grows with the size whoever runs it, so it is measured
bare, in a Python loop on an ndarray, and the bridge's marshalling is
``ours - numpy``.  A size's *flatness* is ``ours / (numpy + marshalling at
1 KiB)``: 1.0 when the bridge adds nothing at that size beyond what it adds
at 1 KiB (for pass-through numpy is 0, so it is ours(size) / ours(1 KiB)).

    python -m benchmarks.size_sweep [--mode smoke|quick|full]
"""
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

SIZES = [16, 256, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [16, 1 << 10, 1 << 20, 64 << 20]
REFERENCE = 1 << 10
KINDS = {"pass-through": T.identity, "fresh a*2": T.times_two}
MIB = 1 << 20


def _loop(body):
    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32),
                                  tf.TensorSpec([], tf.int32)])
    def run(x, n):
        for _ in tf.range(n):
            x = body(x)
        return x
    return run


def _calls(kind, size, mode):
    """Calls per timed run: enough that the tf.function's own dispatch (tens
    of us per run) is negligible next to the calls."""
    most = {"smoke": 50, "quick": 500, "full": 2000}[mode]
    if kind == "pass-through":
        return most
    return int(min(most, max(4, (256 * MIB) // size)))


def measure(sizes, repeats, mode="full", label="size_sweep"):
    """(kind, variant, size) -> seconds per call, one sample per repetition."""
    loops = {}
    for kind, fn in KINDS.items():
        loops[(kind, "ours")] = _loop(lambda x, fn=fn: pfb.numpy_function(fn, [x], tf.float32))
        loops[(kind, "tf")] = _loop(lambda x, fn=fn: tf.numpy_function(fn, [x], tf.float32))
    samples = {}
    for size in sizes:
        x = tf.zeros([size // 4], tf.float32)  # zeros: a * 2 never overflows
        a = x.numpy()
        runs = {}
        for (kind, variant), loop in loops.items():
            calls = _calls(kind, size, mode)
            runs[(kind, variant, size)] = (
                lambda loop=loop, calls=calls, n=tf.constant(calls):
                T.timed(lambda: loop(x, n)) / calls)

        def bare(a=a, calls=_calls("fresh a*2", size, mode)):
            def work():
                for _ in range(calls):
                    T.times_two(a)
            return T.timed(work) / calls
        runs[("fresh a*2", "numpy", size)] = bare
        samples.update(T.alternate(runs, repeats))
        T.progress(f"  {label}: {size} B done")
    return samples


def _label(size):
    if size >= MIB:
        return f"{size // MIB} MiB"
    if size >= 1024:
        return f"{size // 1024} KiB"
    return f"{size} B"


def summarize(samples, sizes):
    cases = {}
    for kind in KINDS:
        numpy = {s: [0.0] * len(samples[(kind, "ours", s)]) if kind == "pass-through"
                 else samples[("fresh a*2", "numpy", s)] for s in sizes}
        ref = [(o - b) for o, b in zip(samples[(kind, "ours", REFERENCE)], numpy[REFERENCE])]
        rows = {}
        for s in sizes:
            ours, theirs = samples[(kind, "ours", s)], samples[(kind, "tf", s)]
            row = T.compare([v * 1e6 for v in ours], [v * 1e6 for v in theirs])
            row["bytes"] = s
            row["numpy_us"] = T.median(numpy[s]) * 1e6
            row["marshalling_us"] = T.median([(o - b) * 1e6 for o, b in zip(ours, numpy[s])])
            row["tf_marshalling_us"] = T.median(
                [(t - b) * 1e6 for t, b in zip(theirs, numpy[s])])
            flat = [T.safe_ratio(o, b + r) for o, b, r in zip(ours, numpy[s], ref)]
            row["flatness"] = T.median(flat)
            row["flatness_range"] = T.span(flat)
            # The same from the fastest run of each (the least disturbed).
            best_ref = min(samples[(kind, "ours", REFERENCE)]) - min(numpy[REFERENCE])
            row["flatness_best"] = T.safe_ratio(min(ours), min(numpy[s]) + best_ref)
            rows[_label(s)] = row
        cases[kind] = rows
    return {"unit": "microseconds per call; ratio = TF / ours; marshalling = per-call time "
                    "minus the same NumPy work done bare; flatness = ours / (numpy + ours' "
                    "marshalling at 1 KiB), 1.0 = flat",
            "cases": cases}


def table(result):
    lines = ["size_sweep (us per call; marshalling = time minus bare NumPy work; "
             "flatness = ours / (numpy + marshalling at 1 KiB))"]
    for kind, rows in result["cases"].items():
        lines.append(f"  {kind}")
        lines.append(f"    {'size':<9}{'ours':>11}{'TF':>11}{'ratio':>8}{'numpy':>11}"
                     f"{'ours marsh.':>12}{'TF marsh.':>11}{'flatness':>10}{'range':>11}"
                     f"{'best':>6}")
        for label, r in rows.items():
            lines.append(
                f"    {label:<9}{r['ours']:>11.1f}{r['tf']:>11.1f}{r['ratio']:>7.1f}x"
                f"{r['numpy_us']:>11.1f}{r['marshalling_us']:>12.1f}{r['tf_marshalling_us']:>11.1f}"
                f"{r['flatness']:>10.2f}{T.fmt_range(r['flatness_range'], 2):>11}"
                f"{r['flatness_best']:>6.2f}")
    return "\n".join(lines)


# mode -> (sizes, repetitions)
MODES = {"smoke": (QUICK_SIZES, 1), "quick": (QUICK_SIZES, 2), "full": (SIZES, 3)}


def run(mode="full"):
    sizes, repeats = MODES[mode]
    return summarize(measure(sizes, repeats, mode), sizes)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
