"""Checks an installed pyfunc_bridge (a wheel, no compiler needed) end to end.

    python tools/check_wheel.py            # with the venv's python

Each check runs in a fresh interpreter, with a timeout, in an empty working
directory, so that the package imported is the installed one and never a
checkout's: numpy_function in a graph, eager py_function with a gradient, a
ProcessPool call, a jit_compile=True call, and the tf.data service launchers
(python -m pyfunc_bridge.service; inside `unshare -rn`, a network namespace
with only loopback, as TensorFlow's servers listen on every interface).
Exits 0 when every check passed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

TIMEOUT = 300

_WHERE = """
    import os, sys, pyfunc_bridge as pfb
    here = os.path.realpath(pfb.__file__)
    assert os.sep + "site-packages" + os.sep in here, f"pyfunc_bridge imported from {here}, not an installed copy"
"""

CHECKS = {
    "numpy_function in a graph": """
        import numpy as np, tensorflow as tf
        @tf.function
        def f(x):
            return pfb.numpy_function(lambda a: a * 2, [x], tf.float32)
        np.testing.assert_array_equal(f(tf.constant([1., 2., 3.])).numpy(), [2., 4., 6.])
    """,
    "eager py_function with a gradient": """
        import tensorflow as tf
        x = tf.constant(3.0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(lambda a: a * a, [x], tf.float32)
        assert float(y) == 9.0, y
        assert float(tape.gradient(y, x)) == 6.0, tape.gradient(y, x)
    """,
    "a ProcessPool call": """
        import os, numpy as np, tensorflow as tf
        with pfb.ProcessPool(1) as pool:
            pid = pfb.numpy_function(lambda a: np.int64(os.getpid()), [tf.constant(0)],
                                     tf.int64, executor=pool)
            assert int(pid) != os.getpid(), "the call ran in this process"
    """,
    "a jit_compile=True call": """
        import numpy as np, tensorflow as tf
        tf.config.set_visible_devices([], "GPU")
        @tf.function(jit_compile=True)
        def f(x):
            return pfb.numpy_function(lambda a: a + 1, [x * 2],
                                      tf.TensorSpec([2], tf.float32)) * 3
        np.testing.assert_array_equal(f(tf.constant([1., 2.])).numpy(), [9., 15.])
    """,
}

# A dispatcher and a worker from the launcher, a pipeline through them, and
# both stopped by SIGTERM with status 0.
_SERVICE = """
    import re, signal, subprocess, sys, time
    import tensorflow as tf
    launcher = [sys.executable, "-m", "pyfunc_bridge.service"]

    def start(*args):
        return subprocess.Popen(launcher + list(args), stdout=subprocess.PIPE, text=True)

    dispatcher = start("dispatcher", "--port", "0")
    port = re.search(r"on port (\\d+)", dispatcher.stdout.readline()).group(1)
    worker = start("worker", "--dispatcher", f"127.0.0.1:{port}",
                   "--worker-address", "127.0.0.1:%port%", "--trust-pickled")
    assert "registered" in worker.stdout.readline()
    ds = tf.data.Dataset.range(6).map(
        lambda i: pfb.numpy_function(lambda a: a * 10, [i], tf.int64, portable=True))
    ds = ds.apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=f"grpc://127.0.0.1:{port}"))
    assert sorted(int(v) for v in ds) == [0, 10, 20, 30, 40, 50]
    for server in (worker, dispatcher):
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, server.returncode
"""
_NETNS = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def _run(name, code, prefix=(), cwd=None):
    source = textwrap.dedent(_WHERE) + textwrap.dedent(code)
    start = time.monotonic()
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", source], cwd=cwd,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"FAIL {name}: no answer in {TIMEOUT} s", flush=True)
        return False
    ok = done.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {name} ({time.monotonic() - start:.1f} s)", flush=True)
    if not ok:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
    return ok


def main():
    with tempfile.TemporaryDirectory() as empty:
        results = [_run(name, code, cwd=empty) for name, code in CHECKS.items()]
        if shutil.which("unshare") and shutil.which("ip"):
            results.append(_run("the service launchers", _SERVICE, _NETNS, cwd=empty))
        else:
            print("FAIL the service launchers: needs `unshare` and `ip` (util-linux, "
                  "iproute2) for a loopback-only network namespace", flush=True)
            results.append(False)
    print(f"{sum(results)} of {len(results)} checks passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
