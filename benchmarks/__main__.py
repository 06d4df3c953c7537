"""pyfunc_bridge's benchmark suite: ours against TF's builtins, side by side.

    python -m benchmarks [--quick | --smoke] [--out DIR] [--only SCENARIO ...]

Scenarios (one module each): graph_overhead, eager_overhead, tf_data,
size_sweep, memory, gil_bound.  Every scenario runs ours and TF's variant alternately
in this process, several repetitions, and reports medians and ratios (the
ratios are the result on a noisy machine).  Writes a table to stdout,
DIR/results.json (one key per scenario, each with ours, TF's and the ratio)
and DIR/benchmark.png (with matplotlib: the ``bench`` extra; without it the
run says so at the start and writes the rest).  --quick takes under a minute; --smoke is the fastest
(one repetition, few calls: checks the suite runs, measures nothing reliably).
"""
import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402
from benchmarks import _timing as T  # noqa: E402
from benchmarks import (eager_overhead, gil_bound, graph_overhead, memory,  # noqa: E402
                        size_sweep, tf_data)

SCENARIOS = {
    "graph_overhead": graph_overhead,
    "eager_overhead": eager_overhead,
    "tf_data": tf_data,
    "size_sweep": size_sweep,
    "memory": memory,
    "gil_bound": gil_bound,
}


def run_all(mode, names):
    results = {}
    for i, name in enumerate(names, 1):
        module = SCENARIOS[name]
        T.progress(f"[{i}/{len(names)}] {name} ...")
        start = time.perf_counter()
        result = module.run(mode)
        result["seconds"] = time.perf_counter() - start
        T.progress(f"[{i}/{len(names)}] {name} done in {result['seconds']:.1f} s")
        results[name] = result
    return results


PLOT_NEEDS = ("the plot (benchmark.png) needs matplotlib, which is not installed: "
              "install the bench extra (pip install -e \".[cpu,bench]\")")


def can_plot():
    """Whether matplotlib is importable (checked before the scenarios run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (sweep, ratios) = plt.subplots(1, 2, figsize=(13, 5))
    if "size_sweep" in results:
        styles = {"pass-through": "-", "fresh a*2": "--"}
        for kind, rows in results["size_sweep"]["cases"].items():
            sizes = [r["bytes"] for r in rows.values()]
            sweep.plot(sizes, [r["ours"] for r in rows.values()], "o" + styles[kind],
                       color="C0", label=f"pfb.numpy_function {kind}")
            sweep.plot(sizes, [r["tf"] for r in rows.values()], "s" + styles[kind],
                       color="C3", label=f"tf.numpy_function {kind}")
            if kind != "pass-through":
                sweep.plot(sizes, [r["numpy_us"] for r in rows.values()], ":",
                           color="gray", label="NumPy a*2 alone")
        sweep.set_xscale("log", base=2)
        sweep.set_yscale("log")
        sweep.set_xlabel("tensor size (bytes)")
        sweep.set_ylabel("time per call in a graph (us)")
        sweep.set_title("Size sweep (float32, in-graph)")
        sweep.grid(True, which="both", alpha=0.3)
        sweep.legend(fontsize=8)
    labels, values, spans = [], [], []
    for name in ("graph_overhead", "eager_overhead"):
        for case, c in results.get(name, {}).get("cases", {}).items():
            # An overhead below the resolution has a lower bound for a ratio.
            value = c["ratio"] if c["ratio"] is not None else c["ratio_above"]
            if value is None:
                continue
            short = case.replace("numpy_function", "np_fn").replace("py_function", "py_fn")
            bound = "" if c["ratio"] is not None else " (lower bound)"
            labels.append(f"{name.split('_')[0]} {short}{bound}")
            values.append(value)
            spans.append(c["ratio_range"] or [value, value])
    for mode, c in results.get("tf_data", {}).get("cases", {}).items():
        labels.append(f"tf.data {mode}")
        values.append(c["ratio"])
        spans.append(c["ratio_range"])
    for case, c in results.get("gil_bound", {}).get("cases", {}).items():
        # Every bar reads "higher is better": the a*2 part's slowdown inverted.
        slowdown = case == "a*2 8 MiB"
        labels.append(f"pool {case}" + (" (speed)" if slowdown else ""))
        values.append(T.safe_ratio(1, c["ratio"]) if slowdown else c["ratio"])
        spans.append(sorted(T.safe_ratio(1, r) for r in c["ratio_range"]) if slowdown
                     else c["ratio_range"])
    if labels:
        # Log scale; a range that a noisy repetition stretched to 0 or inf is
        # drawn clipped to 10x either side of the median.
        finite = [min(max(v, 1e-2), 1e3) for v in values]
        lows = [max(min(lo, f), f / 10) for f, (lo, _) in zip(finite, spans)]
        highs = [min(max(hi, f), f * 10) for f, (_, hi) in zip(finite, spans)]
        errors = [[f - lo for f, lo in zip(finite, lows)],
                  [hi - f for f, hi in zip(finite, highs)]]
        ratios.bar(range(len(labels)), finite, yerr=errors, color="C0", capsize=3)
        ratios.set_yscale("log")
        ratios.axhline(1.0, color="gray", lw=1)
        ratios.set_xticks(range(len(labels)), labels, fontsize=7, rotation=35, ha="right")
        ratios.set_ylabel("TF's cost / ours (tf.data: ours' throughput / TF's; "
                          "pool: vs in-process)")
        ratios.set_title("pyfunc_bridge vs TF's builtin (median, range over repetitions)")
        ratios.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="under a minute")
    mode.add_argument("--smoke", action="store_true",
                      help="fastest: checks that every scenario runs")
    parser.add_argument("--out", default="bench-out", help="output directory (bench-out)")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args(argv)
    selected = args.smoke and "smoke" or args.quick and "quick" or "full"
    T.progress(f"pyfunc_bridge benchmarks ({selected}): {', '.join(args.only)}")
    plotting = can_plot()
    if not plotting:
        T.progress(f"note: {PLOT_NEEDS}; the table and results.json are still written")
    start = time.perf_counter()
    results = run_all(selected, args.only)
    for name in args.only:
        print(SCENARIOS[name].table(results[name]))
        print()
    os.makedirs(args.out, exist_ok=True)
    meta = {"mode": selected, "seconds": time.perf_counter() - start,
            "tensorflow": tf.__version__, "numpy": np.__version__,
            "pyfunc_bridge": pfb.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "stats_enabled": pfb.stats().enabled}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({**results, "meta": meta}, f, indent=2)
    if plotting:
        plot(results, os.path.join(args.out, "benchmark.png"))
        print(f"total {meta['seconds']:.0f} s; wrote {args.out}/results.json and "
              f"{args.out}/benchmark.png")
    else:
        print(f"total {meta['seconds']:.0f} s; wrote {args.out}/results.json; {PLOT_NEEDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
