"""tf.data throughput: a trivial map function through pyfunc_bridge, through
tf.numpy_function, and as a native TF op.

``Dataset.range(N).map(f, num_parallel_calls=...)`` consumed in-graph by
``reduce``, with num_parallel_calls 1 and AUTOTUNE; f adds one to the
element (``a + 1`` in NumPy for the bridges, ``x + 1`` natively).

    python -m benchmarks.tf_data [--mode smoke|quick|full]
"""
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

PARALLELISM = {"1 thread": 1, "AUTOTUNE": tf.data.AUTOTUNE}
MAPS = {
    "ours": lambda x: pfb.numpy_function(T.plus_one, [x], tf.int64),
    "tf": lambda x: tf.numpy_function(T.plus_one, [x], tf.int64),
    "native": lambda x: x + 1,
}


def _pipeline(f, parallel):
    @tf.function
    def consume(n):
        dataset = tf.data.Dataset.range(n).map(f, num_parallel_calls=parallel)
        return dataset.reduce(tf.constant(0, tf.int64), lambda acc, y: acc + y)
    return consume


def measure(elements, repeats, label="tf_data"):
    """'mode/variant' -> elements per second, one sample per repetition."""
    n = tf.constant(elements, tf.int64)
    runs = {}
    for mode, parallel in PARALLELISM.items():
        for variant, f in MAPS.items():
            consume = _pipeline(f, parallel)
            consume(tf.constant(10, tf.int64))  # trace
            runs[f"{mode}/{variant}"] = (
                lambda consume=consume: elements / T.timed(lambda: consume(n)))
    return T.alternate(runs, repeats, label)


def summarize(samples):
    cases = {}
    for mode in PARALLELISM:
        ours, theirs, native = (samples[f"{mode}/{v}"] for v in ("ours", "tf", "native"))
        case = T.compare(ours, theirs, higher_is_better=True)
        case["native"] = T.median(native)
        case["native_range"] = T.span(native)
        case["ours_over_native"] = T.safe_ratio(case["ours"], case["native"])
        case["ours_over_native_range"] = T.span(
            [T.safe_ratio(o, v) for o, v in zip(ours, native)])
        cases[mode] = case
    return {"unit": "elements per second; ratio = ours / tf.numpy_function; "
                    "ours_over_native = ours / native op", "cases": cases}


def table(result):
    lines = ["tf_data (elements/s; ratio = ours / TF, and ours / native)",
             f"  {'num_parallel_calls':<20}{'ours':>9}{'TF':>9}{'native':>9}{'ratio':>8}"
             f"{'range':>10}{'/native':>9}{'range':>11}"]
    for mode, c in result["cases"].items():
        lines.append(f"  {mode:<20}{c['ours']:>9.0f}{c['tf']:>9.0f}{c['native']:>9.0f}"
                     f"{c['ratio']:>7.2f}x{T.fmt_range(c['ratio_range'], 2):>10}"
                     f"{c['ours_over_native']:>8.2f}x"
                     f"{T.fmt_range(c['ours_over_native_range'], 2):>11}")
    return "\n".join(lines)


# mode -> (elements, repetitions)
MODES = {"smoke": (200, 1), "quick": (2000, 2), "full": (20000, 3)}


def run(mode="full"):
    return summarize(measure(*MODES[mode]))


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
