"""Which route a function's inputs take in common pipelines (not part of
``python -m benchmarks``' default set): zero-copy (the call holds TF's buffer
alone, so the function may write it where it lives), a private copy (TF
shares the buffer: ``shared_input``), or a copy into a worker's shared memory
(``worker``).  The figure is the zero-copy share of the input bytes, from
``pfb.stats()``; the function returns nothing, so only inputs are counted.

    python -m benchmarks.input_routes [--mode smoke|quick|full]
"""
import io
import sys

import numpy as np
import tensorflow as tf

import pyfunc_bridge as pfb

ROW = 1024  # floats per element


def consume(*arrays):
    """Reads its inputs, returns no memory (an empty array)."""
    for a in arrays:
        a.sum()
    return np.zeros(0, np.float32)


def _call(x, executor=None):
    return pfb.numpy_function(consume, [x], tf.float32, executor=executor)


def _pngs(n):
    from PIL import Image
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.full((16, 16, 3), i % 255, np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def _pipelines(n, pool):
    rows = np.arange(n * ROW, dtype=np.float32).reshape(n, ROW)
    source = tf.data.Dataset.from_tensor_slices(rows)
    made = tf.data.Dataset.range(n).map(lambda i: tf.fill([ROW], tf.cast(i, tf.float32)))
    cases = {
        "from_tensor_slices + map": source.map(_call),
        "range + map (tf.fill, then the call)": made.map(_call),
        "batch + map": source.batch(8).map(_call),
        "decode_raw + map": tf.data.Dataset.from_tensor_slices(
            [r.tobytes() for r in rows]).map(lambda s: _call(tf.io.decode_raw(s, tf.float32))),
        "pool call (executor=)": made.map(lambda x: _call(x, pool)),
    }
    try:
        pngs = _pngs(n)
        cases["decode_png + map"] = tf.data.Dataset.from_tensor_slices(pngs).map(
            lambda s: _call(tf.io.decode_png(s)))
    except ImportError:  # PIL only makes the inputs
        pass
    return cases


def _measure(run):
    pfb.reset_stats()
    run()
    total = pfb.stats().total
    copied = {k: v for k, v in total.bytes_copied.items() if v}
    moved = total.bytes_zero_copy + sum(copied.values())
    return {"zero_copy_share": total.bytes_zero_copy / moved if moved else None,
            "bytes_zero_copy": total.bytes_zero_copy, "bytes_copied": copied}


def run(mode="full"):
    n = MODES[mode]
    previous = pfb.enable_stats(True)
    cases = {}
    try:
        with pfb.ProcessPool(1, name="input_routes") as pool:
            for name, ds in _pipelines(n, pool).items():
                cases[name] = _measure(lambda ds=ds: [None for _ in ds])
        eager = [tf.constant(r) for r in np.ones((n, ROW), np.float32)]
        cases["eager calls (tensors Python holds)"] = _measure(
            lambda: [_call(x) for x in eager])
        graph = tf.function(lambda x: _call(x * 2.0))
        cases["tf.function (x * 2, then the call)"] = _measure(
            lambda: [graph(x) for x in eager])
    finally:
        pfb.enable_stats(previous)
    return {"unit": "share of input bytes handed over without a copy", "cases": cases}


def table(result):
    lines = ["input_routes (share of input bytes zero-copy; the rest by reason)"]
    for name, c in result["cases"].items():
        share = "n/a" if c["zero_copy_share"] is None else f"{c['zero_copy_share']:.0%}"
        reasons = ", ".join(f"{k} {v:,} B" for k, v in c["bytes_copied"].items()) or "-"
        lines.append(f"  {name:<40} {share:>5}   copied: {reasons}")
    return "\n".join(lines)


MODES = {"smoke": 8, "quick": 64, "full": 512}


if __name__ == "__main__":
    from benchmarks import _timing as T
    T.scenario_main(sys.modules[__name__])
