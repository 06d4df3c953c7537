"""Peak memory of a 64 MiB pass-through loop: does the bridge copy?

A tf.function runs N calls of an identity function on a 64 MiB float32
tensor, each output feeding the next call.  The result is the peak resident
set size during the loop minus the resident size just before it (Linux: the
peak is reset through /proc/self/clear_refs before every run).  Zero copies
mean a peak increase near 0; each copy alive at once adds 64 MiB.

    python -m benchmarks.memory [--mode smoke|quick|full]
"""
import re
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

SIZE = 64 << 20
MIB = 1 << 20


def _status(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(calls, repeats, label="memory"):
    """variant -> peak RSS increase in bytes, one sample per repetition."""
    x = tf.zeros([SIZE // 4], tf.float32)
    n = tf.constant(calls)
    loops = {
        "ours": T.graph_loop(lambda v: pfb.numpy_function(T.identity, [v], tf.float32)),
        "tf": T.graph_loop(lambda v: tf.numpy_function(T.identity, [v], tf.float32)),
        # Shows that the measurement sees copies: two per call (in and out).
        "ours copy=True": T.graph_loop(
            lambda v: pfb.numpy_function(T.identity, [v], tf.float32, copy=True)),
    }

    def peak(loop):
        def run():
            before = _status("VmRSS")
            _reset_peak()
            loop(x, n)
            return max(0, _status("VmHWM") - before)
        return run
    return T.alternate({name: peak(loop) for name, loop in loops.items()}, repeats, label)


def summarize(samples):
    mib = {name: [v / MIB for v in s] for name, s in samples.items()}
    case = T.compare(mib["ours"], mib["tf"])
    # Peak increases near 0 make a plain ratio meaningless: also in tensors.
    case["ours_copies"] = case["ours"] * MIB / SIZE
    case["tf_copies"] = case["tf"] * MIB / SIZE
    case["ours_copy_true"] = T.median(mib["ours copy=True"])
    return {"unit": "MiB of peak RSS above the RSS before the loop (64 MiB pass-through); "
                    "ratio = TF / ours; *_copies = the increase in 64 MiB tensors",
            "cases": {"64 MiB pass-through": case}}


def table(result):
    c = result["cases"]["64 MiB pass-through"]
    return ("memory (peak RSS increase during a 64 MiB pass-through loop)\n"
            f"  ours {c['ours']:.1f} MiB ({c['ours_copies']:.2f} tensors), "
            f"TF {c['tf']:.1f} MiB ({c['tf_copies']:.2f} tensors); ranges "
            f"ours {T.fmt_range(c['ours_range'])}, TF {T.fmt_range(c['tf_range'])} MiB\n"
            f"  (check that copies show: ours with copy=True {c['ours_copy_true']:.1f} MiB)")


# mode -> (calls per run, repetitions)
MODES = {"smoke": (2, 1), "quick": (5, 2), "full": (20, 3)}


def run(mode="full"):
    return summarize(measure(*MODES[mode]))


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
