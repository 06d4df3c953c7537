"""A short demonstration: a NumPy function inside a parallel tf.data pipeline.

    python -m benchmarks.demo
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402


def normalize(row):
    """Zero-mean, unit-variance rows (NumPy, run by the bridge)."""
    centered = row - row.mean()
    return (centered / (centered.std() + 1e-6)).astype(np.float32)


def main():
    spec = tf.TensorSpec([8], tf.float32)
    dataset = (
        tf.data.Dataset.range(6)
        .map(lambda i: tf.cast(tf.range(8, dtype=tf.int64) ** (i % 3 + 1), tf.float32))
        .map(lambda row: pfb.numpy_function(normalize, [row], spec),
             num_parallel_calls=tf.data.AUTOTUNE)
        .batch(3)
    )
    print("pyfunc_bridge demo: normalize rows with NumPy inside tf.data")
    print("element spec:", dataset.element_spec)
    for batch in dataset:
        print(np.array2string(batch.numpy(), precision=3, suppress_small=True))
    total = dataset.unbatch().reduce(0.0, lambda acc, row: acc + tf.reduce_sum(row))
    print(f"sum over all rows (zero up to rounding): {float(total):.6f}")


if __name__ == "__main__":
    main()
