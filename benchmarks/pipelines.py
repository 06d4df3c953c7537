"""Real pipelines: pfb's pool against what users would pick instead.

Two maps of pure-Python work, each over its data set, batched by 32:

* tokenizer: regex split, lowercasing, dictionary lookup and padding to 32
  ids, over thousands of short texts (pipeline_work.tokenize);
* images: PIL decode of small in-memory JPEGs (pipeline_work.decode).

Each runs, as a new user would write it on this machine, with no tuning:

* pfb in-process: ``Dataset.from_tensor_slices(items).map(lambda s:
  pfb.numpy_function(f, [s], dtype), num_parallel_calls=AUTOTUNE).batch(32)``;
* pfb pool: the same with ``executor=ProcessPool(2)``;
* torch: ``DataLoader(dataset, batch_size=32, num_workers=2,
  persistent_workers=True)``, its workers spawned (TensorFlow is not
  fork-safe);
* Grain: ``MapDataset.source(items).repeat().map(f).batch(32)
  .to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=2))``,
  one iterator for the whole run (each new one spawns its workers).

The variants run alternately in this process, several repetitions; reported:
elements per second, the ratios of the pool to the others (the result on a
noisy machine), and this process's CPU time per element (user + sys, all its
threads, getrusage).  Start-up (pools, workers, tracing) is outside the runs.

    python -m benchmarks.pipelines [--mode smoke|quick|full]
"""
import argparse
import os
import resource
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T
from benchmarks.pipeline_work import Mapped, decode, jpegs, texts, tokenize

WORKERS = 2
BATCH = 32
AUTOTUNE = tf.data.AUTOTUNE
VARIANTS = ("pfb in-process", "pfb pool", "torch DataLoader", "Grain")


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measured(run, count):
    """A run for T.alternate: (count / seconds, this process's CPU us per count)."""
    def measure():
        cpu = _cpu_seconds()
        seconds = T.timed(run)
        return count / seconds, (_cpu_seconds() - cpu) / count * 1e6
    return measure


def _tf_data(items, function, dtype, executor):
    dataset = tf.data.Dataset.from_tensor_slices(items).map(
        lambda s: pfb.numpy_function(function, [s], dtype, executor=executor),
        num_parallel_calls=AUTOTUNE).batch(BATCH)

    def epoch():
        for _ in dataset:
            pass
    return epoch


def _torch(items, function):
    try:
        import torch.utils.data as data
    except ImportError:
        return None, None
    loader = data.DataLoader(Mapped(items, function), batch_size=BATCH,
                             num_workers=WORKERS, persistent_workers=True,
                             multiprocessing_context="spawn")

    def epoch():
        for _ in loader:
            pass
    return epoch, None


def _grain(items, function):
    try:
        import grain
        from absl import flags
    except ImportError:
        return None, None
    if not flags.FLAGS.is_parsed():  # Grain reads its options as absl flags
        flags.FLAGS.mark_as_parsed()
    iterator = iter(grain.MapDataset.source(items).repeat().map(function).batch(BATCH)
                    .to_iter_dataset()
                    .mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS)))
    batches = -(-len(items) // BATCH)

    def epoch():
        for _ in range(batches):
            next(iterator)
    return epoch, getattr(iterator, "close", None)


def measure(name, items, function, dtype, pool, repeats):
    """variant -> ([el/s], [CPU us per element]) for one map."""
    runs, closers = {}, []
    runs["pfb in-process"] = _tf_data(items, function, dtype, None)
    runs["pfb pool"] = _tf_data(items, function, dtype, pool)
    for variant, make in (("torch DataLoader", _torch), ("Grain", _grain)):
        epoch, close = make(items, function)
        if epoch is not None:
            runs[variant] = epoch
        if close is not None:
            closers.append(close)
    try:
        samples = T.alternate({v: _measured(run, len(items)) for v, run in runs.items()},
                              repeats, f"pipelines {name}")
    finally:
        for close in closers:
            close()
    return {v: ([r for r, _ in s], [c for _, c in s]) for v, s in samples.items()}


def summarize(found):
    cases = {}
    for name, samples in found.items():
        rates = {v: T.median(r) for v, (r, _) in samples.items()}
        case = {"elements_per_s": rates,
                "cpu_us": {v: T.median(c) for v, (_, c) in samples.items()}}
        pool = samples["pfb pool"][0]
        for other in VARIANTS:
            if other in samples and other != "pfb pool":
                versus = T.compare(pool, samples[other][0], higher_is_better=True)
                case[f"pool / {other}"] = versus["ratio"]
                case[f"pool / {other} range"] = versus["ratio_range"]
        # For the suite's checks: ours = the pool, tf = in-process pfb.
        case.update(ours=rates["pfb pool"], tf=rates["pfb in-process"],
                    ratio=case["pool / pfb in-process"])
        cases[name] = case
    return {"unit": "elements per second (batches of 32); ratios: pfb's ProcessPool(2) over "
                    "each other variant (>1: the pool is faster); cpu_us: this process's "
                    "CPU (user + sys, getrusage) per element",
            "cases": cases}


def table(result):
    lines = [f"pipelines (map at AUTOTUNE, batches of {BATCH}, {WORKERS} workers; "
             "el/s, and the pool's ratio to each; CPU us per element in this process)",
             f"  {'map':<11}{'variant':<18}{'el/s':>9}{'pool/x':>8}{'range':>12}{'CPU us':>8}"]
    for name, case in result["cases"].items():
        for variant in VARIANTS:
            if variant not in case["elements_per_s"]:
                continue
            ratio = case.get(f"pool / {variant}")
            cells = (f"{ratio:>7.2f}x{T.fmt_range(case[f'pool / {variant} range'], 2):>12}"
                     if ratio is not None else f"{'':>8}{'':>12}")
            lines.append(f"  {name:<11}{variant:<18}{case['elements_per_s'][variant]:>9.0f}"
                         f"{cells}{case['cpu_us'][variant]:>8.0f}")
    return "\n".join(lines)


# mode -> (texts, images, repetitions)
MODES = {"smoke": (320, 96, 1), "quick": (4000, 800, 3), "full": (12000, 2400, 5)}


def run(mode="full"):
    n_texts, n_images, repeats = MODES[mode]
    found = {}
    with pfb.ProcessPool(WORKERS, name="pipelines pool") as pool:
        found["tokenizer"] = measure("tokenizer", texts(n_texts), tokenize, tf.int32, pool,
                                     repeats)
        found["images"] = measure("images", jpegs(n_images), decode, tf.uint8, pool, repeats)
    return summarize(found)


def main(argv=None):
    T.scenario_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
