"""A pool call's cost in this process: the native dispatcher (the rings,
src/pool/dispatch.c) against the pool's Python path (the socket).

One call in flight at a time, on a ProcessPool(1): the trivial call (an
identity on 8 bytes) and ``a * 2`` on 8 MiB of float32.  Reported per
call: wall time, and this process's CPU (user + sys from getrusage, all
threads: the caller, the reply or reader thread).  The native variant runs
its calls in one C loop without the GIL (Dispatcher.call_many), as a
kernel's native route does; the Python variant runs ProcessPool.stage and
run, as the conversion layer's driver does for a kernel's first call and
for the calls that keep the Python path, without TF's own per-op cost on
either side.  Ratios: native / Python.

    python -m benchmarks.pool_dispatch [--calls N]
"""
import argparse
import pickle
import resource
import time

import numpy as np

import pyfunc_bridge as pfb
from pyfunc_bridge import _pickling
from benchmarks.gil_work import identity, times_two


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(run, calls):
    wall, cpu = time.perf_counter(), _cpu()
    run(calls)
    return (time.perf_counter() - wall) / calls, (_cpu() - cpu) / calls


def measure(calls):
    rows = []
    with pfb.ProcessPool(1, arena_bytes=64 << 20, name="pool_dispatch bench") as pool:
        worker = pool._workers[0]
        deadline = time.monotonic() + 60
        while not (worker.ready and worker.generation):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start")
            time.sleep(0.01)
        dispatch = pool._dispatch
        for name, func, value, n in (
                ("trivial (8 B)", identity, np.ones(1), calls),
                ("a*2 8 MiB", times_two, np.ones(2 << 20, np.float32), max(calls // 20, 10))):
            token, pickled = pool._functions.get(func)
            dispatch.register(token, pickle.dumps((None, pickled)))

            def native(k):
                dispatch.call_many(token, [value], k)

            def python(k):
                for _ in range(k):
                    descs = pool.stage((value,))
                    result, _, _ = pool.run(func, None, descs, False)
                    del result  # its block goes back with the next message

            native(3), python(3)  # warm: loaded, pages touched
            wall_n, cpu_n = _timed(native, n)
            wall_p, cpu_p = _timed(python, n)
            rows.append((name, n, wall_n, cpu_n, wall_p, cpu_p))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"{'call':<14} {'n':>5} {'native µs':>10} {'cpu µs':>8} {'python µs':>10} "
          f"{'cpu µs':>8} {'wall ratio':>10} {'cpu ratio':>9}")
    for name, n, wall_n, cpu_n, wall_p, cpu_p in measure(args.calls):
        print(f"{name:<14} {n:>5} {wall_n * 1e6:>10.1f} {cpu_n * 1e6:>8.1f} "
              f"{wall_p * 1e6:>10.1f} {cpu_p * 1e6:>8.1f} {wall_n / wall_p:>10.2f} "
              f"{cpu_n / cpu_p:>9.2f}")


if __name__ == "__main__":
    main()
