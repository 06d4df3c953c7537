"""Runs in a private network namespace: starts the dispatcher, the workers
and the client (this folder's travel_service_*.py) as its children, reports
what they did as JSON, and kills them all on the way out.  argv: the folder
for the servers' logs, the seconds it has.

Run by tests/pipelines/test_travel_service.py (tests/fresh_python.py), with
tests/ and tests/pipelines/ on the path, in its own process group."""
import json, socket

from travel_service_servers import answer, client, procs, start

try:
    report = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
    dispatcher = start("dispatcher", "travel_service_dispatcher.py")
    address = f"127.0.0.1:{answer(dispatcher)['port']}"
    report["worker_pids"] = [
        answer(start(f"worker{i}", "travel_service_worker.py", address,
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
