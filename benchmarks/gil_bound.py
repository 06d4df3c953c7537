"""Process workers (executor=): Python that holds the GIL, on several cores.

Each part measures its variants alternately in this process, and reports,
beside the speed, this process's CPU time per element (user + sys from
``getrusage(RUSAGE_SELF)`` around the run, all its threads, divided by the
elements): a pool's calls cost CPU here too, which a training step sharing
the machine does not get.

* map: ``Dataset.range(N).map(f, AUTOTUNE)`` where f does about 1 ms of
  pure-Python work, in-process (pfb.numpy_function) against
  ``executor=ProcessPool(2)``, and ``torch.utils.data.DataLoader(
  num_workers=2)`` running the same function when torch is installed, its
  workers started with spawn (TensorFlow is not fork-safe) (elements per
  second; ratio = pool / in-process, and pool / DataLoader);
* trivial: an identity on a scalar in a parallel map (AUTOTUNE) through the
  pool, in-process pfb.numpy_function and tf.numpy_function (elements per
  second; ratio = pool / tf.numpy_function, and pool / in-process pfb);
* a*2 8 MiB: per-call time of ``a * 2`` on an 8 MiB float32 tensor through
  the pool against in-process (ms per call; ratio = pool / in-process, the
  slowdown; CPU per call);
* workers sweep: the map through ``ProcessPool(n)`` for n = 1, 2, 4, ... up
  to ``--workers`` (default: this machine's cores), against the map's
  in-process speed: how the pool scales on a bigger machine.

    python -m benchmarks.gil_bound [--mode smoke|quick|full] [--workers N]

(Run so, spawn starts each DataLoader worker by importing this module, and
with it TensorFlow, once; ``python -m benchmarks`` does not.  Start-up is
outside the timed runs either way.)
"""
import argparse
import os
import resource
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T
# The functions the workers run live in a module without TensorFlow: a
# function shipped by reference imports its module in every worker.
from benchmarks.gil_work import Work, identity, python_work, times_two

WORKERS = 2
AUTOTUNE = tf.data.AUTOTUNE


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def calibrate(seconds=1e-3, samples=7):
    """The `loops` that make python_work take about `seconds`: scaled from
    the median of several timed calls (after a warm-up), twice, so that one
    slow first call (cold caches, a preempted sample) does not shorten the
    work and with it every call in the scenario."""
    loops = 1000

    def median_time(loops):
        python_work(1, loops)  # warm-up
        times = sorted(T.timed(lambda: python_work(1, loops)) for _ in range(samples))
        return times[samples // 2]

    while median_time(loops) < 2e-4:
        loops *= 4
    for _ in range(2):
        loops = max(1, int(loops * seconds / median_time(loops)))
    return loops


def _cpu_seconds():
    """This process's CPU time so far (user + sys, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measured(run, count):
    """A run for T.alternate: (count / seconds, this process's CPU us per
    count) of one `run()`."""
    def measure():
        cpu = _cpu_seconds()
        seconds = T.timed(run)
        return count / seconds, (_cpu_seconds() - cpu) / count * 1e6
    return measure


def _split(samples):
    """name -> [(rate, cpu)] as (name -> rates, name -> CPU us)."""
    return ({name: [r for r, _ in values] for name, values in samples.items()},
            {name: [c for _, c in values] for name, values in samples.items()})


def _consume(f, parallel=AUTOTUNE):
    @tf.function
    def consume(n):
        dataset = tf.data.Dataset.range(n).map(f, num_parallel_calls=parallel)
        return dataset.reduce(tf.constant(0, tf.int64), lambda acc, y: acc + y)
    return consume


def _map_run(executor, elements, loops):
    """One run of the 1 ms map over `elements` through `executor`."""
    n = tf.constant(elements, tf.int64)
    k = tf.constant(loops, tf.int64)
    consume = _consume(lambda x: pfb.numpy_function(python_work, [x, k], tf.int64,
                                                    executor=executor))
    consume(tf.constant(4, tf.int64))  # trace
    return lambda: consume(n)


def _torch_loader(elements, loops):
    try:
        import torch.utils.data as data
    except ImportError:
        return None
    # spawn, not fork: a fork of this process would copy TensorFlow's threads'
    # locks in whatever state they are in.
    loader = data.DataLoader(Work(elements, loops), batch_size=None,
                             num_workers=WORKERS, persistent_workers=True,
                             multiprocessing_context="spawn")

    def epoch():
        total = 0
        for value in loader:
            total += int(value)
        return total
    return epoch


def measure_map(pool, elements, repeats, loops):
    runs = {variant: _measured(_map_run(executor, elements, loops), elements)
            for variant, executor in (("in-process", None), ("pool", pool))}
    epoch = _torch_loader(elements, loops)
    if epoch is not None:
        runs["torch DataLoader"] = _measured(epoch, elements)
    return _split(T.alternate(runs, repeats, "gil_bound map"))


def measure_trivial(pool, elements, repeats):
    n = tf.constant(elements, tf.int64)
    runs = {}
    for variant, f in (
            ("pool", lambda x: pfb.numpy_function(identity, [x], tf.int64, executor=pool)),
            ("in-process", lambda x: pfb.numpy_function(identity, [x], tf.int64)),
            ("tf", lambda x: tf.numpy_function(identity, [x], tf.int64))):
        consume = _consume(f)
        consume(tf.constant(4, tf.int64))
        runs[variant] = _measured(lambda consume=consume: consume(n), elements)
    return _split(T.alternate(runs, repeats, "gil_bound trivial"))


def measure_large(pool, calls, repeats):
    a = tf.random.uniform([2 << 20])  # 8 MiB of float32
    runs = {}
    for variant, executor in (("in-process", None), ("pool", pool)):
        loop = T.graph_loop(lambda x, executor=executor: pfb.numpy_function(
            times_two, [x], tf.float32, executor=executor))
        loop(a, tf.constant(1))
        runs[variant] = _measured(lambda loop=loop: loop(a, tf.constant(calls)), calls)
    rates, cpu = _split(T.alternate(runs, repeats, "gil_bound a*2 8 MiB"))
    return {name: [1e3 / r for r in values] for name, values in rates.items()}, cpu


def sweep_counts(most):
    """1, 2, 4, ... below `most`, then `most`."""
    counts, n = [], 1
    while n < most:
        counts.append(n)
        n *= 2
    return counts + [most]


def measure_sweep(counts, elements, repeats, loops):
    """workers -> (el/s samples, CPU us samples) of the map through
    ProcessPool(workers); each pool maps elements in proportion to its
    workers, so that every run takes about as long."""
    found = {}
    for workers in counts:
        n = max(elements // 2, elements * workers // WORKERS)
        with pfb.ProcessPool(workers, name=f"gil_bound sweep {workers}") as pool:
            run = _measured(_map_run(pool, n, loops), n)
            samples = T.alternate({workers: run}, repeats,
                                  f"gil_bound sweep {workers} workers")
        found[workers] = _split(samples)
    return found


def _cpu(cpu_samples):
    return {name: T.median(values) for name, values in cpu_samples.items()}


def summarize(map_samples, trivial_samples, large_samples, sweep, loops):
    (map_rates, map_cpu), (trivial_rates, trivial_cpu) = map_samples, trivial_samples
    large_ms, large_cpu = large_samples
    cases = {}
    case = T.compare(map_rates["pool"], map_rates["in-process"], higher_is_better=True)
    case = {"ours": case["ours"], "tf": case["tf"], "ratio": case["ratio"],
            "ratio_range": case["ratio_range"], "loops": loops, "cpu_us": _cpu(map_cpu)}
    torch = map_rates.get("torch DataLoader")
    if torch:
        versus = T.compare(map_rates["pool"], torch, higher_is_better=True)
        case["torch"] = versus["tf"]
        case["ours_over_torch"] = versus["ratio"]
        case["ours_over_torch_range"] = versus["ratio_range"]
    cases["map 1 ms Python"] = case
    trivial = T.compare(trivial_rates["pool"], trivial_rates["tf"], higher_is_better=True)
    versus = T.compare(trivial_rates["pool"], trivial_rates["in-process"],
                       higher_is_better=True)
    trivial.update(in_process=versus["tf"], ratio_in_process=versus["ratio"],
                   ratio_in_process_range=versus["ratio_range"], cpu_us=_cpu(trivial_cpu))
    cases["trivial map"] = trivial
    large = T.compare(large_ms["pool"], large_ms["in-process"])
    # For this part the ratio reads as the pool's slowdown (pool / in-process).
    large["ratio"] = T.safe_ratio(large["ours"], large["tf"])
    large["ratio_range"] = sorted(T.safe_ratio(1, r) for r in large["ratio_range"])
    large["cpu_us"] = _cpu(large_cpu)  # per call
    cases["a*2 8 MiB"] = large
    in_process = case["tf"]
    rows = [{"workers": workers, "elements_per_s": T.median(rates[workers]),
             "speedup": T.safe_ratio(T.median(rates[workers]), in_process),
             "cpu_us": T.median(cpu[workers])}
            for workers, (rates, cpu) in sweep.items()]
    return {"unit": "map and trivial map: elements per second, ratio = pool / in-process "
                    "(map: in-process pfb; trivial: tf.numpy_function, and ratio_in_process "
                    "against in-process pfb); a*2 8 MiB: ms per call, ratio = pool / "
                    "in-process (the slowdown); cpu_us: this process's CPU (user + sys, "
                    "getrusage) per element (a*2: per call) by variant; ours = the "
                    f"ProcessPool ({WORKERS} workers); sweep: the map through "
                    "ProcessPool(workers), speedup over in-process",
            "cases": cases, "sweep": rows, "cores": cores()}


def table(result):
    c = result["cases"]
    m, t, big = c["map 1 ms Python"], c["trivial map"], c["a*2 8 MiB"]
    lines = [f"gil_bound (ProcessPool({WORKERS}) against in-process; CPU: this process's "
             "user+sys per element, a*2: per call)",
             f"  {'case':<26}{'pool':>10}{'other':>10}{'ratio':>8}{'range':>12}"
             f"{'CPU us: pool':>15}{'other':>9}"]

    def row(label, ours, other, ratio, span, cpu_ours, cpu_other, digits=0, note=""):
        cpu = (f"{cpu_ours:>15.0f}{cpu_other:>9.0f}" if cpu_other is not None
               else f"{'':>15}{'':>9}")
        lines.append(f"  {label:<26}{ours:>10.{digits}f}{other:>10.{digits}f}{ratio:>7.2f}x"
                     f"{T.fmt_range(span, 2):>12}{cpu}{note}")

    cpu = m["cpu_us"]
    row("map 1 ms (el/s) in-proc", m["ours"], m["tf"], m["ratio"], m["ratio_range"],
        cpu["pool"], cpu["in-process"])
    if "torch" in m:
        row("  vs torch DataLoader", m["ours"], m["torch"], m["ours_over_torch"],
            m["ours_over_torch_range"], cpu["pool"], cpu["torch DataLoader"])
    cpu = t["cpu_us"]
    row("trivial (el/s) in-proc", t["ours"], t["in_process"], t["ratio_in_process"],
        t["ratio_in_process_range"], cpu["pool"], cpu["in-process"])
    row("  vs tf.numpy_function", t["ours"], t["tf"], t["ratio"], t["ratio_range"],
        cpu["pool"], cpu["tf"])
    cpu = big["cpu_us"]
    row("a*2 8 MiB (ms/call)", big["ours"], big["tf"], big["ratio"], big["ratio_range"],
        cpu["pool"], cpu["in-process"], digits=2, note="  (slowdown)")
    lines.append(f"  workers sweep, 1 ms map ({result['cores']} cores; in-process "
                 f"{m['tf']:.0f} el/s):")
    lines.append(f"    {'workers':>7}{'el/s':>10}{'speedup':>9}{'CPU us/el':>11}")
    for r in result["sweep"]:
        lines.append(f"    {r['workers']:>7}{r['elements_per_s']:>10.0f}"
                     f"{r['speedup']:>8.2f}x{r['cpu_us']:>11.0f}")
    return "\n".join(lines)


# mode -> (map elements, trivial elements, a*2 calls, repetitions)
MODES = {"smoke": (40, 200, 3, 1), "quick": (300, 3000, 20, 3), "full": (600, 10000, 50, 5)}


def run(mode="full", workers=None):
    """`workers`: the largest pool of the sweep (default: this machine's cores)."""
    map_elements, trivial_elements, calls, repeats = MODES[mode]
    loops = calibrate()
    with pfb.ProcessPool(WORKERS, name="gil_bound pool") as pool:
        map_samples = measure_map(pool, map_elements, repeats, loops)
        trivial_samples = measure_trivial(pool, trivial_elements, repeats)
        large_samples = measure_large(pool, calls, repeats)
    sweep = measure_sweep(sweep_counts(workers or cores()), map_elements, repeats, loops)
    return summarize(map_samples, trivial_samples, large_samples, sweep, loops)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=list(MODES), default="full")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="the sweep's largest pool: 1, 2, 4, ... up to N workers "
                             f"(default: this machine's cores, {cores()})")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    print(table(run(args.mode, args.workers)))


if __name__ == "__main__":
    main()
