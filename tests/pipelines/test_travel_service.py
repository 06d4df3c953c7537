"""Functions that travel to tf.data service workers in other processes,
and the service launchers (pyfunc_bridge/service.py).  TF's tf.data service
servers listen on every interface, so they run only inside a private network
namespace that has nothing but loopback; every process a test starts is
killed by that test."""
import json
import shutil

import pytest

from fresh_python import fresh_python
from travel_helpers import TIMEOUT, fresh_env


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
        probe = fresh_python("print('ok')", prefix=_NETNS, env=fresh_env(), timeout=60)
    except AssertionError:  # fresh_python's timeout (the probe was killed)
        pytest.skip(f"`unshare -rn` did not finish in 60 s: {why}")
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        pytest.skip(f"`unshare -rn` with `ip link set lo up` failed "
                    f"({probe.stderr.strip()[-500:]}): {why}")
    return _NETNS


def _run_driver(driver, tmp_path):
    """Runs tests/scripts/pipelines/`driver` in a private network namespace,
    in its own process group (killed whole at a timeout: the driver and every
    server); returns the JSON report it prints last."""
    netns = _network_namespace()
    proc = fresh_python(f"pipelines/{driver}", tmp_path, 2 * TIMEOUT, prefix=netns,
                        env=fresh_env(), timeout=2 * TIMEOUT + 120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["interfaces"] == ["lo"]  # nothing beyond loopback
    return report


# A tf.data service: a dispatcher and two workers, each in its own process
# (the scripts tests/scripts/pipelines/travel_service_*.py).

def test_tf_data_service_workers_in_other_processes(tmp_path):
    report = _run_driver("travel_service_driver.py", tmp_path)
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

def test_tf_data_service_with_the_launchers(tmp_path):
    report = _run_driver("travel_service_launcher_driver.py", tmp_path)
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
    return fresh_python("-m pyfunc_bridge.service", *args, env=fresh_env(), timeout=TIMEOUT)


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
