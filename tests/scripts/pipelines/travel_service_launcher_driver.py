"""Runs in a private network namespace: starts the service with the
launchers (python -m pyfunc_bridge.service), reads it in both processing
modes, reads TF's own dispatcher (no pyfunc_bridge), stops the servers by
signals while a reader reads, reports all that as JSON and kills what is
left on the way out.  argv: the folder for the servers' logs, the seconds
it has.

Run by tests/pipelines/test_travel_service.py (tests/fresh_python.py), with
tests/ and tests/pipelines/ on the path, in its own process group."""
import json, re, signal, socket, subprocess

from travel_service_servers import answer, client, line, procs, start, stderr_of

LAUNCHER = ["-m", "pyfunc_bridge.service"]


def registered(server):
    # The launcher reports once its server is up (a worker: registered).
    text = line(server)
    match = re.search(r"(?:worker (\d+) registered|listening on port (\d+))", text)
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
    dispatcher = start("dispatcher", LAUNCHER + ["dispatcher", "--port", "0"])
    report["dispatcher"], port = registered(dispatcher)
    address = f"127.0.0.1:{port}"
    workers = [start(f"worker{i}", LAUNCHER + [
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
    plain = start("plain", "travel_service_plain_dispatcher.py")
    read = client("distributed_epoch", f"127.0.0.1:{answer(plain)['port']}")
    report["plain_dispatcher"] = [read.returncode, read.stderr[-2000:]]
    # The servers are stopped while a client reads an endless pipeline:
    # the workers' threads are in bridge calls when stop() comes.
    reader = start("reader", "travel_service_reader.py", f"grpc://{address}")
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
