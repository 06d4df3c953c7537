"""A pool call's cost in this process, by the way it is made.

One call in flight at a time, on a ProcessPool(1): the trivial call (an
identity on 8 bytes) and ``a * 2`` on 8 MiB of float32.  Reported per call:
wall time, and this process's CPU (user + sys from getrusage, all threads:
the caller, the dispatcher's reply thread).  The ways:

- ``native``: a C loop over the dispatcher without the GIL
  (Route.call_many), as a kernel's native route calls;
- ``python``: ProcessPool.ring_call and ProcessPool.decode, the rings from
  Python, as the conversion layer's driver calls for eager calls and a
  kernel's first call;
- ``eager``: ``pfb.numpy_function(..., executor=pool)`` in eager mode, TF's
  per-op cost included, against ``in-process``: the same eager call without
  a pool.

Then where a trivial call's wall time goes, from the stamps the worker puts
in its DONE (CLOCK_REALTIME, one machine): from the post (stamped as
Route.call is called) to the worker's start (the worker's wake-up), in the
worker, and from the worker's end to the caller holding its answer (the
caller, reading its worker's reply ring, wakes; or the dispatcher's reply
thread, then the caller), with the calls whose caller read its own reply
and the reply threads' sleeps, per call.

    python -m benchmarks.pool_dispatch [--calls N]
"""
import argparse
import resource
import time

import numpy as np

import pyfunc_bridge as pfb
from benchmarks.gil_work import identity, times_two


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(run, calls):
    run(3)  # warm: loaded, pages touched
    wall, cpu = time.perf_counter(), _cpu()
    run(calls)
    return (time.perf_counter() - wall) / calls, (_cpu() - cpu) / calls


def measure(calls):
    import tensorflow as tf

    from pyfunc_bridge import _library
    view = _library.conversion().worker_result  # what the conversion layer passes down
    rows = []
    with pfb.ProcessPool(1, arena_bytes=64 << 20, name="pool_dispatch bench") as pool:
        for name, func, value, n in (
                ("trivial (8 B)", identity, np.ones(1), calls),
                ("a*2 8 MiB", times_two, np.ones(2 << 20, np.float32), max(calls // 20, 10))):
            tensor = tf.constant(value)
            dtype = tf.as_dtype(value.dtype)
            pool.ring_call(func, None, (value,), False, False)  # registered, worker ready
            route = pool.native_route(func, None, False, False)

            def native(k):
                route.call_many([value], k)

            def python(k):
                for _ in range(k):
                    _, reply, _ = pool.ring_call(func, None, (value,), False, False)
                    result = pool.decode(reply, False, view)
                    del reply, result  # its block goes back

            def eager(k, executor=pool):
                for _ in range(k):
                    pfb.numpy_function(func, [tensor], dtype, executor=executor)

            def in_process(k):
                eager(k, None)

            rows.append((name, n, [_timed(way, n) for way in
                                   (native, python, eager, in_process)]))
    return rows


WAYS = ("native", "python", "eager", "in-process")


def breakdown(calls):
    """Mean µs per trivial call over the rings from Python, by stage; the
    calls whose caller read its own reply, and the reply threads' sleeps,
    per call."""
    with pfb.ProcessPool(1, name="pool_dispatch breakdown") as pool:
        value = np.ones(1)
        route = pool.native_route(identity, None, False, False)
        for _ in range(3):
            pool.ring_call(identity, None, (value,), False, False)
        stages = [0, 0, 0]
        counts = pool._dispatch.counts()
        for _ in range(calls):
            posted = time.clock_gettime_ns(time.CLOCK_REALTIME)
            reply, _ = route.call((value,), None)
            back = time.clock_gettime_ns(time.CLOCK_REALTIME)
            stamp, ended = reply.message.stamp, reply.message.ended
            del reply  # its block goes back
            stages[0] += stamp - posted
            stages[1] += ended - stamp
            stages[2] += back - ended
        after = pool._dispatch.counts()
    return ([s / calls / 1e3 for s in stages],
            [(after[k] - counts[k]) / calls for k in ("caller_reads", "reply_sleeps")])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print("per call, µs of wall time / of this process's CPU")
    print(f"{'call':<14} {'n':>5} " + " ".join(f"{w:>15}" for w in WAYS))
    for name, n, timings in measure(args.calls):
        print(f"{name:<14} {n:>5} " + " ".join(f"{w * 1e6:>7.1f}/{c * 1e6:>7.1f}"
                                             for w, c in timings))
    (to_worker, in_worker, to_caller), (reads, sleeps) = breakdown(args.calls)
    print(f"trivial call over the rings, µs: post to the worker's start {to_worker:.1f}, "
          f"in the worker {in_worker:.1f}, worker's end to the caller {to_caller:.1f} "
          f"(per call: caller reads {reads:.2f}, reply-thread sleeps {sleeps:.2f})")


if __name__ == "__main__":
    main()
