"""Per-call overhead of py_function on GPU tensors inside a tf.function:
pyfunc_bridge vs tf.py_function (not part of ``python -m benchmarks``' default
set; it needs a GPU and says so without one).

The same loops as graph_overhead, placed on the first GPU: each iteration
applies the op to 16 float32 values that live in device memory, and the
overhead is the iteration's time minus that of a bare ``x * 1.0`` loop run
around it.  Functions: `identity` (hands TF's tensor back), `plus_one` (one
eager TF op on the GPU), `a_plus_b` (two inputs).  ratio = TF's overhead /
ours.

    python -m benchmarks.gpu_overhead [--mode smoke|quick|full]
"""
import sys

import tensorflow as tf

import pyfunc_bridge as pfb
from benchmarks import _timing as T

BARE = "bare op (x * 1.0)"
NO_GPU = "no GPU: TensorFlow lists no GPU device here"


def variants():
    """name -> loop body; ("py_function", function) -> (ours' name, TF's name)."""
    bodies = {BARE: lambda x: x * 1.0}
    pairs = {}
    for fn, arity in ([(fn, 1) for fn in T.FUNCTIONS]
                      + [(fn, 2) for fn in T.TWO_INPUT_FUNCTIONS]):
        ours, theirs = f"pfb py_function {fn.__name__}", f"tf py_function {fn.__name__}"
        bodies[ours] = lambda x, fn=fn, k=arity: pfb.py_function(fn, [x] * k, tf.float32)
        bodies[theirs] = lambda x, fn=fn, k=arity: tf.py_function(fn, [x] * k, tf.float32)
        pairs[("py_function", fn.__name__)] = (ours, theirs)
    return bodies, pairs


def measure(iterations, repeats, device, label="gpu_overhead"):
    """name -> one T.Bracketed sample (seconds per iteration) per repetition."""
    with tf.device(device):
        x = tf.zeros([16], tf.float32)
        n = tf.constant(iterations)
        bodies, pairs = variants()
        runs = {}
        for name, body in bodies.items():
            loop = T.graph_loop(body)
            loop(x, tf.constant(2))  # trace

            def run(loop=loop):
                with tf.device(device):
                    return T.timed(lambda: loop(x, n).numpy()) / iterations
            runs[name] = run
        return T.interleaved(runs, BARE, repeats, label), pairs


def summarize(samples, pairs, device):
    bare = [s.bare for name in samples for s in samples[name]]
    return {"unit": "microseconds of overhead per call on GPU tensors (per-iteration time "
                    "minus the mean of the two bare x * 1.0 loops run around it); "
                    "ratio = TF's overhead / ours",
            "device": device,
            "bare_op_us": T.median(bare) * 1e6,
            "cases": T.overhead_cases(samples, pairs)}


def table(result):
    if "skipped" in result:
        return f"gpu_overhead: skipped ({result['skipped']})"
    return "\n".join(T.overhead_table(
        f"gpu_overhead on {result['device']} (us per call above a bare op of "
        f"{result['bare_op_us']:.2f} us; ratio = TF / ours)", result["cases"]))


# mode -> (iterations per run, repetitions)
MODES = {"smoke": (300, 1), "quick": (3000, 3), "full": (20000, 7)}


def run(mode="full"):
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return {"skipped": NO_GPU}
    samples, pairs = measure(*MODES[mode], gpus[0].name)
    return summarize(samples, pairs, gpus[0].name)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
