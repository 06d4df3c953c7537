"""pyfunc_bridge's calls on TF's profiler trace, drawn without TensorBoard.

Runs a small tf.data pipeline under ``tf.profiler.experimental.start/stop``:
a NumPy decode step (in-process, its strided result copied), a py_function
of TF ops, and pure-Python work run by a ProcessPool (``executor=``).  Reads
the ``.xplane.pb`` that TF writes with TF's own ``xplane_pb2`` and draws the
bridge's events, one row per thread, as docs/profiler_trace.png: each call
named after its function, and inside it the steps (inputs, the function,
outputs) and, for the pool, the queue and the worker's compute.  Prints each
function's calls and mean step times, and what a call costs while a session
records against without one.

    python -m benchmarks.profiler_trace [--png PATH] [--logdir DIR]
"""
import argparse
import collections
import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402
from benchmarks import _timing as T  # noqa: E402
# Run by the pool's workers: a module that does not import TensorFlow.
from benchmarks.gil_work import python_work  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = os.path.join(ROOT, "docs", "profiler_trace.png")
STEPS = ("pfb.inputs", "pfb.function", "pfb.outputs")
POOL = ("pfb.queue", "pfb.worker", "pfb.reply")
ELEMENTS = 6
SIZE = 192

# `line`: the trace's line (one per thread, by its id), `thread` its name
# (threads of a pool share one); `start` and `end` in ps since the epoch, exact.
Event = collections.namedtuple("Event", "line thread name start end stats")


def decode(index):
    """A stand-in for decoding an image with NumPy: a few passes over 144 KiB,
    returning every other column (a strided view: the bridge copies it)."""
    image = np.random.default_rng(int(index)).random((SIZE, SIZE), dtype=np.float32)
    for _ in range(6):
        image = np.sqrt(image * image + 0.5)
    return image[:, ::2]


def augment(image):
    """TF ops on the EagerTensor (py_function)."""
    return tf.image.flip_left_right(image[..., None])[..., 0] * 0.5


def pipeline(pool, loops):
    spec = tf.TensorSpec([SIZE, SIZE // 2], tf.float32)
    return (tf.data.Dataset.range(ELEMENTS)
            .map(lambda i: pfb.numpy_function(decode, [i], spec), num_parallel_calls=2)
            .map(lambda image: pfb.py_function(augment, [image], spec), num_parallel_calls=2)
            .map(lambda image: (image, pfb.numpy_function(
                python_work, [tf.cast(tf.reduce_sum(image), tf.int64), loops], tf.int64,
                executor=pool)), num_parallel_calls=2))


def read_trace(logdir):
    """Every event of the host plane of the one .xplane.pb under `logdir`
    (tests/api/test_api_profiler.py reads traces with it too)."""
    paths = glob.glob(os.path.join(str(logdir), "**", "*.xplane.pb"), recursive=True)
    if len(paths) != 1:
        raise RuntimeError(f"expected one .xplane.pb under {logdir}, found {paths}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {i: m.name for i, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                stats = {}
                for s in ev.stats:
                    kind = s.WhichOneof("value")
                    value = getattr(s, kind)
                    stats[names[s.metadata_id]] = names[value] if kind == "ref_value" else value
                start = line.timestamp_ns * 1000 + ev.offset_ps
                events.append(Event(line.id, line.name,
                                    plane.event_metadata[ev.metadata_id].name,
                                    start, start + ev.duration_ps, stats))
    return events


def bridge_events(events):
    """The bridge's events: each call (it has an `api`) and its nested steps."""
    return [e for e in events if "api" in e.stats or e.name in STEPS + POOL]


def summary(events):
    """function -> (calls, mean us of each nested step)."""
    rows = {}
    calls = [e for e in events if "api" in e.stats]
    for call in calls:
        inside = [e for e in events if e.line == call.line and e is not call
                  and call.start <= e.start and e.end <= call.end]
        row = rows.setdefault(call.name, collections.defaultdict(list))
        row["call"].append(call.end - call.start)
        for e in inside:
            row[e.name].append(e.end - e.start)
    return {name: {step: np.mean(times) / 1e6 for step, times in row.items()}
            | {"calls": len(row["call"])} for name, row in rows.items()}


def _kib(n):
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} B"


def draw(events, path):
    """The timeline (one row per thread) above one call of each function
    (its steps' mean times, and what its events' metadata says it copied)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.patches as mpatches
    import matplotlib.pyplot as plt

    threads = sorted({(e.thread, e.line) for e in events})
    calls = [e for e in events if "api" in e.stats]
    functions = sorted({e.name for e in calls})
    colors = {name: f"C{i}" for i, name in enumerate(functions)}
    step_colors = {"pfb.inputs": "#8da0cb", "pfb.function": "#66c2a5",
                   "pfb.outputs": "#fc8d62", "pfb.queue": "#bbbbbb", "pfb.worker": "#e78ac3",
                   "pfb.reply": "#ffd92f"}
    level = dict.fromkeys(STEPS, 1) | dict.fromkeys(POOL, 2)
    t0 = min(e.start for e in events)
    fig, (timeline, zoom) = plt.subplots(
        2, 1, figsize=(13, 2.6 + 0.9 * len(threads) + 0.45 * len(functions)),
        gridspec_kw={"height_ratios": [len(threads) * 1.2, len(functions) * 0.55 + 0.4]})
    for row, (_, line) in enumerate(threads):
        for e in events:
            if e.line != line:
                continue
            x, width = (e.start - t0) / 1e9, (e.end - e.start) / 1e9
            if "api" in e.stats:
                timeline.broken_barh([(x, width)], (row - 0.45, 0.3), color=colors[e.name],
                                     edgecolor="white", linewidth=0.6)
                short = e.name.rsplit(".", 1)[-1]
                if width > 0.1 * len(short):
                    timeline.text(x + width / 2, row - 0.3, short, ha="center", va="center",
                                  fontsize=7, color="white", clip_on=True)
            else:
                y = row - 0.45 + 0.3 * level[e.name]
                timeline.broken_barh([(x, width)], (y + 0.02, 0.26), color=step_colors[e.name],
                                     edgecolor="white", linewidth=0.4)
    timeline.set_yticks(range(len(threads)))
    timeline.set_yticklabels([t.split("/")[0] + (f" #{i}" if "/" in t else "")
                              for i, (t, _) in enumerate(threads)])
    timeline.invert_yaxis()
    timeline.set_xlabel("ms since the first call")
    timeline.set_title("pyfunc_bridge calls on TensorFlow's profiler trace "
                       "(read from the .xplane.pb; one row per thread)")
    timeline.grid(axis="x", alpha=0.3)
    handles = ([mpatches.Patch(color=colors[f], label=f) for f in functions]
               + [mpatches.Patch(color=c, label=s) for s, c in step_colors.items()])
    timeline.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    fontsize=8, frameon=False)

    means = summary(events)
    longest = max(sum(means[f].get(s, 0.0) for s in STEPS) for f in functions)
    for row, name in enumerate(functions):
        x = 0.0
        for step in STEPS:
            width = means[name].get(step, 0.0)
            zoom.broken_barh([(x, width)], (row - 0.3, 0.6), color=step_colors[step])
            if step == "pfb.function" and "pfb.worker" in means[name]:
                start = x
                for part in POOL:
                    zoom.broken_barh([(start, means[name][part])], (row + 0.05, 0.25),
                                     color=step_colors[part])
                    start += means[name][part]
            x += width
        call = next(e for e in calls if e.name == name)
        copies = ", ".join(f"{reason} {_kib(call.stats[f'bytes_copied_{reason}'])}"
                           for reason in call.stats.get("copy_reasons", "").split())
        parts = ", ".join(f"{step[4:]} {means[name][step]:.0f}" for step in STEPS + POOL
                          if step in means[name])
        zoom.text(longest * 1.03, row,
                  f"{name} ({call.stats['api']})\n{parts} us; in "
                  f"{_kib(call.stats['bytes_in'])}, out {_kib(call.stats['bytes_out'])}"
                  f"{', copied ' + copies if copies else ''}", va="center", fontsize=8)
    zoom.set_yticks([])
    zoom.invert_yaxis()
    zoom.set_xlim(0, longest * 2.3)
    zoom.set_xlabel("us: one call of each function, its steps' mean times")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def per_call_cost(iterations=5000, repeats=5):
    """Seconds per call without a profiler session and while one records
    (alternated; the session's start and stop are not timed; fastest runs,
    the least disturbed on a shared machine), name -> (off, on):

    - "eager": an identity numpy_function called eagerly (no op dispatched:
      besides the bridge's four events TF records one, its handle's deletion);
    - "graph": the same in a graph's ``tf.range`` loop (TF records the loop's
      ops too);
    - "bare": a bare ``x * 1.0`` loop, TF's own events of a loop."""
    x = tf.constant(np.arange(16, dtype=np.float32))
    n = tf.constant(iterations)

    def eager_loop(x, n):
        for _ in range(iterations):
            pfb.numpy_function(T.identity, [x], tf.float32)
    loops = {"eager": eager_loop,
             "graph": T.graph_loop(lambda x: pfb.numpy_function(T.identity, [x], tf.float32)),
             "bare": T.graph_loop(lambda x: x * 1.0)}
    runs = {}
    for name, loop in loops.items():
        loop(x, tf.constant(2))

        def off(loop=loop):
            return T.timed(lambda: loop(x, n)) / iterations

        def on(loop=loop):
            with tempfile.TemporaryDirectory() as logdir:
                tf.profiler.experimental.start(logdir)
                try:
                    return T.timed(lambda: loop(x, n)) / iterations
                finally:
                    tf.profiler.experimental.stop()
        runs[(name, "off")], runs[(name, "on")] = off, on
    samples = T.alternate(runs, repeats)
    return {name: (min(samples[(name, "off")]), min(samples[(name, "on")])) for name in loops}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", default=PNG, help=f"where to draw (default {PNG})")
    parser.add_argument("--logdir", help="where TF writes the trace (default: a temporary folder)")
    parser.add_argument("--no-cost", action="store_true", help="skip the per-call cost")
    args = parser.parse_args(argv)
    loops = 12000  # about 1 ms of Python per element in a worker (gil_work)
    with pfb.ProcessPool(2, name="trace pool") as pool, \
            tempfile.TemporaryDirectory() as scratch:
        logdir = args.logdir or scratch
        dataset = pipeline(pool, loops)
        list(dataset)  # traced, workers started, functions sent
        tf.profiler.experimental.start(logdir)
        try:
            list(dataset)
        finally:
            tf.profiler.experimental.stop()
        events = bridge_events(read_trace(logdir))
    if not events:
        sys.exit("no pyfunc_bridge event in the trace")
    print(f"{'function':<40}{'calls':>6}{'call':>10}{'inputs':>9}{'function':>10}"
          f"{'outputs':>9}{'queue':>9}{'worker':>9}{'reply':>9}   (mean us)")
    for name, row in sorted(summary(events).items()):
        cells = "".join(f"{row[k]:>{w}.0f}" if k in row else f"{'-':>{w}}"
                        for k, w in (("call", 10), ("pfb.inputs", 9), ("pfb.function", 10),
                                     ("pfb.outputs", 9), ("pfb.queue", 9), ("pfb.worker", 9),
                                     ("pfb.reply", 9)))
        print(f"{name:<40}{row['calls']:>6}{cells}")
    draw(events, args.png)
    print(f"wrote {args.png}")
    if not args.no_cost:
        print("us per call without a profiler session / while one records (fastest of 5 runs):")
        for name, (off, on) in per_call_cost().items():
            what = {"eager": "identity numpy_function, eager",
                    "graph": "identity numpy_function, graph loop",
                    "bare": "bare x * 1.0, graph loop"}[name]
            print(f"  {what:<38}{off * 1e6:>7.2f} /{on * 1e6:>7.2f}  (+{(on - off) * 1e6:.2f})")

if __name__ == "__main__":
    main()
