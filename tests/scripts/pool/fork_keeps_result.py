"""A forked child lets go of its parent's pools' shared memory: it holds no
descriptor of their memfds and maps none of them (their mappings are its own
memory now), the result tensors it inherited (from the Python path and from
a kernel's native route) keep their values while the parent lets go of their
blocks and the worker reuses them, and using the pool there is a clear
error.

Run by tests/pool/test_process_pool_fork.py in a fresh interpreter
(tests/fresh_python.py)."""
import json, os
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
from pool_checks import child_exit_code, memfds_of
NAME = "fork result pool"

def shared():
    return memfds_of(NAME)

with pfb.ProcessPool(1, name=NAME) as pool:
    graph = tf.function(lambda x: pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32,
                                                     executor=pool))
    graph(tf.constant(0.0))  # the kernel's first call sets up its route
    eager = pfb.numpy_function(pf.quarter_mib_of, [tf.constant(1.0)], tf.float32,
                               executor=pool)
    native = graph(tf.constant(2.0))
    addresses = {pfb.to_numpy(eager).ctypes.data, pfb.to_numpy(native).ctypes.data}
    x = tf.constant(3.0)
    fds, maps = shared()
    assert fds and maps, (fds, maps)  # (the probe sees them)
    go_r, go_w = os.pipe()
    seen_r, seen_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(go_r, 1)  # the parent let go of the blocks, and the worker reused them
        report = {"values": [float(v) for t in (eager, native)
                             for v in (pfb.to_numpy(t)[0], pfb.to_numpy(t)[-1])]}
        report["fds"], report["maps"] = shared()
        try:
            pfb.numpy_function(pf.quarter_mib_of, [x], tf.float32, executor=pool)
        except tf.errors.FailedPreconditionError as exc:
            report["error"] = str(exc)
        os.write(seen_w, json.dumps(report).encode())
        os._exit(0)  # (TensorFlow's own exit hangs in a fork of a process that ran ops)
    del eager, native
    later = [pfb.numpy_function(pf.quarter_mib_of, [tf.constant(7.0)], tf.float32,
                                executor=pool) for _ in range(2)]
    later += [graph(tf.constant(7.0)) for _ in range(2)]
    reused = addresses & {pfb.to_numpy(t).ctypes.data for t in later}
    os.write(go_w, b"x")
    report = json.loads(os.read(seen_r, 1 << 16).decode())
    child_exit_code(child, "the child hung")
    assert report["values"] == [1.0, 1.0, 2.0, 2.0], (report, reused)
    assert report["fds"] == [] and report["maps"] == [], report
    error = report.get("error", "")
    assert f"'{NAME}'" in error and "is a fork of it" in error and \
        "Start a ProcessPool in this process" in error, report
    assert [float(t[0]) for t in later] == [7.0] * 4
print("done")
