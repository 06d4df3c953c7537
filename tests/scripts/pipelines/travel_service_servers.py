"""What both tf.data service drivers share: starting servers as children
(each reporting on its stdout, its stderr in a log file) and reading their
lines, all before a deadline.  The drivers' argv: the folder of the logs,
then the seconds they have.

Imported by travel_service_driver.py and travel_service_launcher_driver.py,
which run in a private network namespace (tests/pipelines/test_travel_service.py)."""
import json, os, queue, subprocess, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
logs, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
procs = []


def left():
    return max(deadline - time.monotonic(), 1.0)


def stderr_of(name):
    with open(os.path.join(logs, name + ".log")) as f:
        return f.read()[-3000:]


def argv_of(script):
    # `script`: a script of this folder, or the arguments after the interpreter.
    return [os.path.join(HERE, script)] if isinstance(script, str) else list(script)


def start(name, script, *args, **env):
    # stderr to a file: a pipe nobody reads could fill up and stall it.
    with open(os.path.join(logs, name + ".log"), "w") as stderr:
        proc = subprocess.Popen([sys.executable, *argv_of(script), *args],
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
    return subprocess.run([sys.executable, *argv_of("travel_service_client.py"),
                           f"grpc://{address}", mode],
                          capture_output=True, text=True, timeout=left())
