"""Functions that travel to tf.data service workers in other processes,
and the service launchers (pyfunc_bridge/service.py).  TF's tf.data service
servers listen on every interface, so they run only inside a private network
namespace that has nothing but loopback; every process a test starts is
killed by that test."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from travel_helpers import TIMEOUT, fresh_env


# A tf.data service: a dispatcher and two workers, each in its own process.

_DISPATCHER = """
    import json, time
    import tensorflow as tf
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    print(json.dumps({"port": int(dispatcher.target.rsplit(":", 1)[1])}), flush=True)
    # Reports when both workers are registered, so the job reaches both.
    deadline = time.monotonic() + 120
    while dispatcher._num_workers() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    print(json.dumps({"workers": dispatcher._num_workers()}), flush=True)
    dispatcher.join()
"""

_WORKER = """
    import json, os, sys
    import tensorflow as tf
    import pyfunc_bridge
    import travel_functions  # declares the functions the pipeline names
    service = tf.data.experimental.service
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=sys.argv[1], worker_address="127.0.0.1:%port%", port=0))
    print(json.dumps({"pid": os.getpid()}), flush=True)
    worker.join()
"""

_CLIENT = """
    import json, sys
    import tensorflow as tf
    import pyfunc_bridge as pfb
    import travel_functions as tfn
    offset = 1000

    ds = tf.data.Dataset.range(20)
    ds = ds.map(lambda i: pfb.numpy_function(tfn.affine, [i], tf.int64),
                num_parallel_calls=4)
    ds = ds.map(lambda v: pfb.numpy_function(lambda a: a + offset, [v], tf.int64,
                                             portable=True), num_parallel_calls=4)
    ds = ds.map(lambda v: (v, pfb.numpy_function(tfn.worker_pid, [v], tf.int64)))
    ds = ds.apply(tf.data.experimental.service.distribute(
        processing_mode=sys.argv[2], service=sys.argv[1]))
    print(json.dumps([[int(v), int(pid)] for v, pid in ds]))
"""


# What both service drivers share: starting servers as children (each
# reporting on its stdout) and reading their lines.
_DRIVER_HELPERS = """
    import json, os, queue, re, signal, socket, subprocess, sys, threading, time

    scripts = json.loads(sys.argv[1])
    logs, deadline = sys.argv[2], time.monotonic() + float(sys.argv[3])
    procs = []

    def left():
        return max(deadline - time.monotonic(), 1.0)

    def stderr_of(name):
        with open(os.path.join(logs, name + ".log")) as f:
            return f.read()[-3000:]

    def start(name, script, *args, **env):
        # `script`: Python source, or the arguments after the interpreter.
        argv = ["-c", script] if isinstance(script, str) else list(script)
        # stderr to a file: a pipe nobody reads could fill up and stall it.
        with open(os.path.join(logs, name + ".log"), "w") as stderr:
            proc = subprocess.Popen([sys.executable, *argv, *args],
                                    env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                    stderr=stderr, text=True)
        procs.append(proc)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],
                         daemon=True).start()
        return name, lines, proc

    def line(server):
        name, lines, _ = server
        try:
            return lines.get(timeout=left())
        except queue.Empty:
            raise SystemExit(f"{name}: no answer in time; stderr: {stderr_of(name)}")

    def answer(server):
        return json.loads(line(server))

    def client(mode, address):
        return subprocess.run([sys.executable, "-c", scripts["client"],
                               f"grpc://{address}", mode],
                              capture_output=True, text=True, timeout=left())
"""

# Runs in a private network namespace (_NETNS): starts the dispatcher, the
# workers and the client as its children, reports what they did as JSON, and
# kills them all on the way out.
_SERVICE_DRIVER = _DRIVER_HELPERS + """
    try:
        report = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
        dispatcher = start("dispatcher", scripts["dispatcher"])
        address = f"127.0.0.1:{answer(dispatcher)['port']}"
        report["worker_pids"] = [
            answer(start(f"worker{i}", scripts["worker"], address,
                         PFB_TRUST_PICKLED="1"))["pid"]
            for i in range(2)]
        report["registered"] = answer(dispatcher)
        read = client("parallel_epochs", address)
        if read.returncode != 0:
            raise SystemExit(f"client failed: {read.stderr[-4000:]}")
        report["pairs"] = json.loads(read.stdout.strip().splitlines()[-1])
        print(json.dumps(report), flush=True)
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=60)
"""

# Runs a program in a new user and network namespace whose only interface,
# loopback, is brought up: nothing outside can reach what listens there.
_NETNS = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def _network_namespace():
    """_NETNS, or a skip saying why a private network namespace cannot be made."""
    why = ("the tf.data service test runs TF's servers, which listen on every "
           "interface, only in a private network namespace")
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: {why}")
    try:
        probe = subprocess.run(_NETNS + [sys.executable, "-c", "print('ok')"],
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip(f"`unshare -rn` did not finish in 60 s: {why}")
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        pytest.skip(f"`unshare -rn` with `ip link set lo up` failed "
                    f"({probe.stderr.strip()[-500:]}): {why}")
    return _NETNS


def _run_driver(driver, scripts, tmp_path):
    """Runs `driver` in a private network namespace with `scripts` (name ->
    Python source, or the arguments after the interpreter); returns the JSON
    report it prints last."""
    netns = _network_namespace()
    scripts = {name: textwrap.dedent(script) if isinstance(script, str) else script
               for name, script in scripts.items()}
    driver = subprocess.Popen(
        netns + [sys.executable, "-c", textwrap.dedent(driver),
                 json.dumps(scripts), str(tmp_path), str(2 * TIMEOUT)],
        env=fresh_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group: all of it can be killed
    try:
        out, err = driver.communicate(timeout=2 * TIMEOUT + 120)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and every server
        driver.communicate()
        raise AssertionError(f"the tf.data service test did not finish in "
                             f"{2 * TIMEOUT + 120} s") from None
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["interfaces"] == ["lo"]  # nothing beyond loopback
    return report


def test_tf_data_service_workers_in_other_processes(tmp_path):
    report = _run_driver(_SERVICE_DRIVER, {"dispatcher": _DISPATCHER, "worker": _WORKER,
                                           "client": _CLIENT}, tmp_path)
    assert report["registered"] == {"workers": 2}
    # parallel_epochs: each worker runs the whole pipeline once.
    want = sorted(3 * i + 1 + 1000 for i in range(20))
    by_worker = {}
    for value, pid in report["pairs"]:
        by_worker.setdefault(pid, []).append(value)
    assert set(by_worker) == set(report["worker_pids"])
    for values in by_worker.values():
        assert sorted(values) == want


# --------------------------------------------------------------------------
# The same service started with the launchers (python -m pyfunc_bridge.service),
# in both processing modes; beside them TF's own dispatcher, which has not
# imported pyfunc_bridge, fails a distributed_epoch job.

_LAUNCHER = ["-m", "pyfunc_bridge.service"]

_LAUNCHER_DRIVER = _DRIVER_HELPERS + """
    def registered(server):
        # The launcher reports once its server is up (a worker: registered).
        text = line(server)
        match = re.search(r"(?:worker (\\d+) registered|listening on port (\\d+))", text)
        if match is None:
            raise SystemExit(f"{server[0]}: unexpected report {text!r}")
        return text, int(match.group(1) or match.group(2))

    def stop(servers):
        # Each is sent its signal by its pid, then waited for; the finally
        # below kills what is left.
        for (_, _, proc), signum in servers:
            proc.send_signal(signum)
        stopped = {}
        for (name, _, proc), signum in servers:
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = "still running 60 s after " + signal.Signals(signum).name
            stopped[name] = [code, stderr_of(name).strip().splitlines()[-1:]]
        return stopped

    try:
        report = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
        dispatcher = start("dispatcher", scripts["launcher"] + ["dispatcher", "--port", "0"])
        report["dispatcher"], port = registered(dispatcher)
        address = f"127.0.0.1:{port}"
        workers = [start(f"worker{i}", scripts["launcher"] + [
            "worker", "--dispatcher", address, "--worker-address", "127.0.0.1:%port%",
            "--import", "travel_functions", "--trust-pickled"]) for i in range(2)]
        report["workers"] = [registered(worker)[1] for worker in workers]
        report["pairs"] = {}
        for mode in ("parallel_epochs", "distributed_epoch"):
            read = client(mode, address)
            if read.returncode != 0:
                raise SystemExit(f"{mode} client failed: {read.stderr[-4000:]}")
            report["pairs"][mode] = json.loads(read.stdout.strip().splitlines()[-1])
        # TF's dispatcher without the ops, and the same distributed_epoch job.
        plain = start("plain", scripts["plain_dispatcher"])
        read = client("distributed_epoch", f"127.0.0.1:{answer(plain)['port']}")
        report["plain_dispatcher"] = [read.returncode, read.stderr[-2000:]]
        # The servers are stopped while a client reads an endless pipeline:
        # the workers' threads are in bridge calls when stop() comes.
        reader = start("reader", scripts["reader"], f"grpc://{address}")
        report["reading"] = answer(reader)
        report["stopped"] = stop([(workers[0], signal.SIGTERM),
                                  (workers[1], signal.SIGINT)])
        report["stopped"].update(stop([(dispatcher, signal.SIGTERM)]))
        print(json.dumps(report), flush=True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(timeout=60)
"""

_READER = """
    import json, sys, time
    import tensorflow as tf
    import pyfunc_bridge as pfb

    def slow(a):  # the workers' threads spend their time in bridge calls
        time.sleep(0.001)
        return a

    ds = tf.data.Dataset.range(10**12).map(
        lambda i: pfb.numpy_function(slow, [i], tf.int64, portable=True),
        num_parallel_calls=4)
    ds = ds.apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=sys.argv[1]))
    for n, _ in enumerate(ds):
        if n == 2000:
            print(json.dumps({"read": n}), flush=True)
"""

_PLAIN_DISPATCHER = """
    import json
    import tensorflow as tf
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    print(json.dumps({"port": int(dispatcher.target.rsplit(":", 1)[1])}), flush=True)
    dispatcher.join()
"""


def test_tf_data_service_with_the_launchers(tmp_path):
    report = _run_driver(_LAUNCHER_DRIVER, {"launcher": _LAUNCHER, "client": _CLIENT,
                                            "plain_dispatcher": _PLAIN_DISPATCHER,
                                            "reader": _READER}, tmp_path)
    assert "dispatcher listening on port" in report["dispatcher"]
    worker_pids = set(report["workers"])
    assert len(worker_pids) == 2
    want = sorted(3 * i + 1 + 1000 for i in range(20))
    # parallel_epochs: each worker runs the whole pipeline once.
    by_worker = {}
    for value, pid in report["pairs"]["parallel_epochs"]:
        by_worker.setdefault(pid, []).append(value)
    assert set(by_worker) == worker_pids
    assert all(sorted(values) == want for values in by_worker.values())
    # distributed_epoch: the dispatcher splits the source; each element once.
    pairs = report["pairs"]["distributed_epoch"]
    assert sorted(value for value, _ in pairs) == want
    assert {pid for _, pid in pairs} <= worker_pids
    # Why the dispatcher needs the ops: TF's own fails that job.
    code, stderr = report["plain_dispatcher"]
    assert code != 0 and "Op type not registered 'PyfuncBridge>" in stderr
    # SIGTERM and SIGINT stop the servers, and the launchers exit cleanly,
    # also while a client is reading (a worker's stop() holds the GIL while
    # its threads end, and they were in bridge calls).
    assert report["reading"] == {"read": 2000}
    for name, signame in [("dispatcher", "SIGTERM"), ("worker0", "SIGTERM"),
                          ("worker1", "SIGINT")]:
        code, last = report["stopped"][name]
        assert code == 0, (name, code, last)
        assert last == [f"python -m pyfunc_bridge.service: {name.rstrip('01')} stopped "
                        f"({signame})"]


def _launcher(*args):
    """The launcher with `args`, in a fresh interpreter; for what it does before
    any server starts (so outside a network namespace)."""
    return subprocess.run([sys.executable, *_LAUNCHER, *args], env=fresh_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_launcher_help_says_what_each_server_needs():
    top = _launcher("--help")
    assert top.returncode == 0
    assert "dispatcher" in top.stdout and "worker" in top.stdout
    dispatcher = " ".join(_launcher("dispatcher", "--help").stdout.split())
    assert "distributed_epoch" in dispatcher and "Op type not registered" in dispatcher
    worker = " ".join(_launcher("worker", "--help").stdout.split())
    for option in ("--dispatcher", "--port", "--worker-address", "--import",
                   "--trust-pickled", "PFB_TRUST_PICKLED=1"):
        assert option in worker


@pytest.mark.parametrize("args,message", [
    (["worker"], "the following arguments are required: --dispatcher"),
    (["dispatcher", "--port", "70000"], "'70000' is not a port (0 to 65535)"),
    (["server"], "invalid choice: 'server'"),
])
def test_launcher_usage_errors(args, message):
    proc = _launcher(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_launcher_worker_names_a_module_it_cannot_import():
    proc = _launcher("worker", "--dispatcher", "127.0.0.1:1", "--import",
                     "no_such_module_anywhere")
    assert proc.returncode == 2
    assert ("--import no_such_module_anywhere: ModuleNotFoundError: No module named "
            "'no_such_module_anywhere'") in proc.stderr
