"""Per-call time against tensor size, 16 B to 64 MiB (float32, in-graph).

Two user functions: pass-through (`identity`, returns its input) and fresh
output (`times_two`, returns ``a * 2``).  Each variant runs N calls in a
``tf.range`` loop inside one tf.function, the output feeding the next call.

What "flat" means: with nothing copied, the bridge's cost must not grow with
the size.  For a fresh output the NumPy work (``a * 2``: allocating and
writing the result) grows with the size whoever runs it, so it is measured
bare, in a Python loop, the same way pfb's graph loop runs it: as many calls
per run, from the same input, each result feeding the next call (so two
results are alive at a time), under the allocator pfb runs the function
under (its aligned allocator with its block cache).  The bridge's
*marshalling* is ``ours - numpy``, paired per repetition; where the noise
outweighs it (a median not above 0) it is printed as "~0".  (Measured
otherwise, with each result dropped at once under NumPy's default allocator,
the bare loop page-faulted where the bridge did not: at 64 MiB that
allocator maps and unmaps every result, about 540 minor faults per call, and
``ours - numpy`` came out negative.)  TF's marshalling is not shown: its
numpy_function copies results into TF's own allocations, which no bare NumPy
loop reproduces, so a subtraction would not be honest; the ratio compares
the whole calls.  A size's *flatness* is ``ours / (numpy + marshalling at
1 KiB)``: 1.0 when the bridge adds nothing at that size beyond what it adds
at 1 KiB (for pass-through numpy is 0, so it is ours(size) / ours(1 KiB)).

    python -m benchmarks.size_sweep [--mode smoke|quick|full]
"""
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T
from pyfunc_bridge._conversion import aligned_allocation

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
            if (kind, variant) == ("fresh a*2", "ours"):  # its baseline right after it
                runs[(kind, "numpy", size)] = _bare(a, calls)
        samples.update(T.alternate(runs, repeats))
        T.progress(f"  {label}: {size} B done")
    return samples


def _bare(a, calls):
    """A run of the NumPy work alone, as pfb's graph loop runs it: `calls`
    calls from `a`, each result the next call's input (the previous one freed
    once the next exists), under the aligned allocator pfb installs around
    the function."""
    def work():
        y = a
        for _ in range(calls):
            y = T.times_two(y)

    def run():
        with aligned_allocation():
            return T.timed(work) / calls
    return run


def _marshalling(variant, baseline):
    """Median of the per-repetition differences, in us; None where the noise
    outweighs it (not above 0)."""
    value = T.median([(v - b) * 1e6 for v, b in zip(variant, baseline)])
    return value if value > 0 else None


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
                 else samples[(kind, "numpy", s)] for s in sizes}
        ref_samples = samples[(kind, "ours", REFERENCE)]
        ref = (_marshalling(ref_samples, numpy[REFERENCE]) or 0.0) * 1e-6
        best_ref = max(min(ref_samples) - min(numpy[REFERENCE]), 0.0)
        rows = {}
        for s in sizes:
            ours, theirs = samples[(kind, "ours", s)], samples[(kind, "tf", s)]
            row = T.compare([v * 1e6 for v in ours], [v * 1e6 for v in theirs])
            row["bytes"] = s
            row["numpy_us"] = T.median(numpy[s]) * 1e6
            row["marshalling_us"] = _marshalling(ours, numpy[s])
            flat = [T.safe_ratio(o, b + ref) for o, b in zip(ours, numpy[s])]
            row["flatness"] = T.median(flat)
            row["flatness_range"] = T.span(flat)
            # The same from the fastest run of each (the least disturbed).
            row["flatness_best"] = T.safe_ratio(min(ours), min(numpy[s]) + best_ref)
            rows[_label(s)] = row
        cases[kind] = rows
    return {"unit": "microseconds per call; ratio = TF / ours; numpy = the same NumPy work "
                    "done bare as pfb's graph loop runs it (each result feeding the next, "
                    "under pfb's aligned allocator); marshalling = ours' per-call time minus "
                    "that (None: below the noise); flatness = ours / (numpy + marshalling "
                    "at 1 KiB), 1.0 = flat",
            "cases": cases}


def _fmt_marshalling(value):
    return f"{value:.1f}" if value is not None else "~0"


def table(result):
    lines = ["size_sweep (us per call; numpy = the NumPy work alone, as pfb's loop runs it; "
             "marshalling = ours minus numpy, ~0: below the noise; flatness = ours / "
             "(numpy + marshalling at 1 KiB))"]
    for kind, rows in result["cases"].items():
        lines.append(f"  {kind}")
        lines.append(f"    {'size':<9}{'ours':>11}{'TF':>11}{'ratio':>8}{'numpy':>11}"
                     f"{'marshalling':>13}{'flatness':>10}{'range':>12}{'best':>7}")
        for label, r in rows.items():
            lines.append(
                f"    {label:<9}{r['ours']:>11.1f}{r['tf']:>11.1f}{r['ratio']:>7.1f}x"
                f"{r['numpy_us']:>11.1f}{_fmt_marshalling(r['marshalling_us']):>13}"
                f"{r['flatness']:>10.2f}{T.fmt_range(r['flatness_range'], 2):>12}"
                f"{r['flatness_best']:>7.2f}")
    return "\n".join(lines)


# mode -> (sizes, repetitions)
MODES = {"smoke": (QUICK_SIZES, 1), "quick": (QUICK_SIZES, 2), "full": (SIZES, 3)}


def run(mode="full"):
    sizes, repeats = MODES[mode]
    return summarize(measure(sizes, repeats, mode), sizes)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
