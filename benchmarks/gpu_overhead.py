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
    """name -> loop body; (family, function) -> (ours' name, TF's name).
    numpy_function has no GPU kernel (NumPy reads host memory, in TF too):
    its rows include TF's copies between the GPU and the host."""
    bodies = {BARE: lambda x: x * 1.0}
    pairs = {}
    cases = ([("py_function", fn, 1) for fn in T.FUNCTIONS]
             + [("py_function", fn, 2) for fn in T.TWO_INPUT_FUNCTIONS]
             + [("numpy_function", T.identity, 1)])
    for family, fn, arity in cases:
        ours_api, tf_api = getattr(pfb, family), getattr(tf, family)
        ours, theirs = f"pfb {family} {fn.__name__}", f"tf {family} {fn.__name__}"
        bodies[ours] = lambda x, f=ours_api, fn=fn, k=arity: f(fn, [x] * k, tf.float32)
        bodies[theirs] = lambda x, f=tf_api, fn=fn, k=arity: f(fn, [x] * k, tf.float32)
        pairs[(family, fn.__name__)] = (ours, theirs)
    return bodies, pairs


def measure_eager(calls, repeats, device, label="gpu_overhead eager"):
    """Eager py_function identity on a GPU tensor: seconds per call, ours and TF's."""
    with tf.device(device):
        x = tf.zeros([16], tf.float32)

    def run(api):
        def one():
            with tf.device(device):
                for _ in range(calls):
                    y = api(T.identity, [x], tf.float32)
                y.numpy()
        return lambda: T.timed(one) / calls
    return T.alternate({"ours": run(pfb.py_function), "tf": run(tf.py_function)},
                       repeats, label)


def measure(iterations, repeats, device, label="gpu_overhead"):
    """name -> one T.Bracketed sample (seconds per iteration) per repetition."""
    with tf.device(device):
        x = tf.zeros([16], tf.float32)
    bodies, pairs = variants()
    runs = T.loop_runs(bodies, x, iterations, scope=lambda name: tf.device(device))
    return T.interleaved(runs, BARE, repeats, label), pairs


def summarize(samples, pairs, device, eager):
    bare = [s.bare for name in samples for s in samples[name]]
    us = {name: [v * 1e6 for v in values] for name, values in eager.items()}
    return {"unit": "microseconds of overhead per call on GPU tensors (per-iteration time "
                    "minus the mean of the two bare x * 1.0 loops run around it); "
                    "ratio = TF's overhead / ours; eager: us per call, whole",
            "device": device,
            "bare_op_us": T.median(bare) * 1e6,
            "cases": T.overhead_cases(samples, pairs),
            "eager py_function identity": T.compare(us["ours"], us["tf"])}


def table(result):
    if "skipped" in result:
        return f"gpu_overhead: skipped ({result['skipped']})"
    e = result["eager py_function identity"]
    return "\n".join(T.overhead_table(
        f"gpu_overhead on {result['device']} (us per call above a bare op of "
        f"{result['bare_op_us']:.2f} us; ratio = TF / ours)", result["cases"])
        + [f"  eager py_function identity, whole call: ours {e['ours']:.1f} us, "
           f"TF {e['tf']:.1f} us, ratio {e['ratio']:.1f}x (range {T.fmt_range(e['ratio_range'])})"])


# mode -> (iterations per run, repetitions)
MODES = {"smoke": (300, 1), "quick": (3000, 3), "full": (20000, 7)}


def run(mode="full"):
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return {"skipped": NO_GPU}
    iterations, repeats = MODES[mode]
    samples, pairs = measure(iterations, repeats, gpus[0].name)
    eager = measure_eager(iterations // 3, repeats, gpus[0].name)
    return summarize(samples, pairs, gpus[0].name, eager)


if __name__ == "__main__":
    T.scenario_main(sys.modules[__name__])
