"""Cost of one conversion: pyfunc_bridge's DLPack API vs TensorFlow's own.

Each row times one call (eager, a 4 KiB float32 tensor, memory 64-byte
aligned so every path is zero-copy unless it says "copy"), as the median of
several timeit repetitions.  Rows come in comparable pairs: pfb's call, then
the closest thing TensorFlow (or NumPy) offers.  torch and JAX rows appear
when those are installed.

    python -m benchmarks.dlpack [--number N] [--repeats R]
"""
import argparse
import statistics
import timeit

import numpy as np
import tensorflow as tf

import pyfunc_bridge as pfb

tf_from_dlpack = tf.experimental.dlpack.from_dlpack
tf_to_dlpack = tf.experimental.dlpack.to_dlpack


def cases():
    """name -> zero-argument callable, grouped in comparable pairs."""
    with pfb._library.conversion().aligned_allocation():
        array = np.arange(1024, dtype=np.float32)
    tensor = tf.constant(array)
    view = pfb.to_numpy(tensor)
    rows = {
        "pfb.to_numpy(t)": lambda: pfb.to_numpy(tensor),
        "np.asarray(t)": lambda: np.asarray(tensor),
        "t.numpy() (copy)": lambda: tensor.numpy(),
        "pfb.from_numpy(read-only view)": lambda: pfb.from_numpy(view),
        "pfb.from_numpy(a, copy=False)": lambda: pfb.from_numpy(array, copy=False),
        "tf_from_dlpack(a.__dlpack__())": lambda: tf_from_dlpack(array.__dlpack__()),
        "pfb.from_numpy(writable a) (copy)": lambda: pfb.from_numpy(array),
        "tf.constant(a) (copy)": lambda: tf.constant(array),
        "pfb.from_dlpack(a)": lambda: pfb.from_dlpack(array),
        "pfb.from_dlpack(a.__dlpack__())": lambda: pfb.from_dlpack(array.__dlpack__()),
        "pfb.to_dlpack(t).__dlpack__()": lambda: pfb.to_dlpack(tensor).__dlpack__(),
        "tf_to_dlpack(t)": lambda: tf_to_dlpack(tensor),
        "np.from_dlpack(pfb.to_dlpack(t))": lambda: np.from_dlpack(pfb.to_dlpack(tensor)),
        "np.from_dlpack(t)": lambda: np.from_dlpack(tensor),
        "pfb.from_dlpack(t) (TF -> TF)": lambda: pfb.from_dlpack(tensor),
        "tf_from_dlpack(tf_to_dlpack(t))": lambda: tf_from_dlpack(tf_to_dlpack(tensor)),
    }
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tt = torch.arange(1024, dtype=torch.float32)
        rows.update({
            "pfb.from_dlpack(torch)": lambda: pfb.from_dlpack(tt),
            "tf_from_dlpack(torch to_dlpack)": lambda: tf_from_dlpack(
                torch.utils.dlpack.to_dlpack(tt)),
            "torch.from_dlpack(pfb.to_dlpack(t))": lambda: torch.from_dlpack(
                pfb.to_dlpack(tensor)),
            "torch.from_dlpack(tf_to_dlpack(t))": lambda: torch.from_dlpack(
                tf_to_dlpack(tensor)),
        })
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp
    except ImportError:
        jax = None
    if jax is not None:
        ja = jnp.arange(1024, dtype=jnp.float32)
        rows.update({
            "pfb.from_dlpack(jax)": lambda: pfb.from_dlpack(ja),
            "tf_from_dlpack(jax.__dlpack__())": lambda: tf_from_dlpack(ja.__dlpack__()),
            "jax from_dlpack(pfb.to_dlpack(t)) (copy)": lambda: jax.dlpack.from_dlpack(
                pfb.to_dlpack(tensor)),
            "jax from_dlpack(t) (TF's __dlpack__, copy)": lambda: jax.dlpack.from_dlpack(
                tensor),
        })
    return rows


def measure(number, repeats):
    """Median microseconds per call for each case."""
    results = {}
    for name, call in cases().items():
        call()  # warm up
        times = timeit.repeat(call, number=number, repeat=repeats)
        results[name] = statistics.median(times) / number * 1e6
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    for name, us in measure(args.number, args.repeats).items():
        print(f"{name:<46}{us:>8.2f} us")


if __name__ == "__main__":
    main()
