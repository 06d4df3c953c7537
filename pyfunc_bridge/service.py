"""Launchers for a tf.data service that runs pipelines with pyfunc_bridge ops.

Usage::

    python -m pyfunc_bridge.service dispatcher --port 5050
    python -m pyfunc_bridge.service worker --dispatcher HOST:5050 [--port P]
        [--worker-address ADDRESS] [--import MODULE ...] [--trust-pickled]

Each starts one of TensorFlow's servers (``tf.data.experimental.service``'s
``DispatchServer`` or ``WorkerServer``) in a process that has imported
pyfunc_bridge, and runs until SIGTERM or SIGINT (Ctrl-C), when it stops the
server and exits with status 0.

- The dispatcher needs the ops registered: with
  ``processing_mode="distributed_epoch"`` it builds the pipeline's graph to
  split its source among the workers, and a graph naming an op that is not
  registered fails with "Op type not registered".  It never runs a function.
- A worker runs the pipeline, so it needs the ops and the functions: those
  named by reference must be declared by a module it imports
  (``--import``, repeatable), and pickled ones run only with
  ``--trust-pickled`` (or ``PFB_TRUST_PICKLED=1`` in its environment).

TensorFlow's servers listen on every network interface (they take no bind
address): run them on a trusted network only.
"""
import argparse
import importlib
import os
import signal
import sys

import tensorflow as tf

import pyfunc_bridge
from pyfunc_bridge import _library, _portable

_PROG = "python -m pyfunc_bridge.service"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _parser():
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Start a tf.data service dispatcher or worker in a process that "
                    "has the pyfunc_bridge ops registered. It runs until SIGTERM or "
                    "SIGINT (Ctrl-C), then stops the server and exits with status 0. "
                    "TensorFlow's servers listen on every network interface: run them "
                    "on a trusted network only.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dispatcher = commands.add_parser(
        "dispatcher", help="start a dispatcher",
        description="Start a tf.data service dispatcher with the pyfunc_bridge ops "
                    "registered. It needs them for processing_mode='distributed_epoch', "
                    "where it builds the pipeline's graph to split its source among the "
                    "workers (without them: 'Op type not registered'). It runs no "
                    "function.")
    dispatcher.add_argument("--port", type=_port, default=5050,
                            help="the port to listen on (default 5050; 0: any free port)")
    worker = commands.add_parser(
        "worker", help="start a worker",
        description="Start a tf.data service worker that runs pipelines with "
                    "pyfunc_bridge ops. Functions named by reference run only when a "
                    "module imported here (--import) declares them (@pfb.portable or "
                    "the decorator forms); pickled functions (portable=True) run only "
                    "with --trust-pickled or PFB_TRUST_PICKLED=1.")
    worker.add_argument("--dispatcher", required=True, metavar="HOST:PORT",
                        help="the dispatcher's address")
    worker.add_argument("--port", type=_port, default=0,
                        help="the port to listen on (default 0: any free port)")
    worker.add_argument("--worker-address", metavar="HOST:PORT",
                        default="localhost:%port%",
                        help="the address the dispatcher gives clients to reach this "
                             "worker; %%port%% stands for the port it listens on "
                             "(default localhost:%%port%%: name this host when the "
                             "clients run elsewhere)")
    worker.add_argument("--import", dest="modules", action="append", default=[],
                        metavar="MODULE",
                        help="import MODULE first, to declare the functions the "
                             "pipelines name (repeatable)")
    worker.add_argument("--trust-pickled", action="store_true",
                        help="run functions embedded as pickles (portable=True); "
                             "unpickling can run arbitrary code, so only for graphs "
                             "from authors you trust")
    return parser


def _port(text):
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return port


def _say(message, stream=sys.stdout):
    print(f"{_PROG}: {message}", file=stream, flush=True)


class _StopSignals:
    """SIGTERM and SIGINT, caught from the start (one that arrives while the
    server starts is kept), and waited for by `wait`.

    Either may be delivered to any of TF's threads, where no Python code
    runs: the C-level handler writes the signal's number to a pipe
    (signal.set_wakeup_fd) that the main thread reads, whichever thread it
    hit.  (A server's own join() would not return on either.)"""

    def __init__(self):
        self._read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end)
        for signum in _STOP_SIGNALS:
            signal.signal(signum, lambda signum, frame: None)  # the pipe carries it

    def wait(self):
        """Blocks until SIGTERM or SIGINT; returns its name."""
        while True:
            for number in os.read(self._read_end, 64):
                if number in _STOP_SIGNALS:
                    return signal.Signals(number).name


def _serve(server, what, signals):
    stopped_by = signals.wait()
    # stop() holds the GIL while it waits for the server's threads; a
    # pipeline thread waiting for the GIL in a bridge call would never end.
    # From here on such calls fail at once (CancelledError), and the calls
    # already in Python get up to 10 s to finish.
    _library.begin_shutdown()
    server.stop()
    _say(f"{what} stopped ({stopped_by})", sys.stderr)


def _dispatcher(args, signals):
    service = tf.data.experimental.service
    try:
        server = service.DispatchServer(service.DispatcherConfig(port=args.port))
    except tf.errors.OpError as exc:
        _say(f"the dispatcher could not start on port {args.port}: {exc.message}",
             sys.stderr)
        return 1
    port = server.target.rsplit(":", 1)[1]
    _say(f"dispatcher listening on port {port} (pyfunc_bridge {pyfunc_bridge.__version__} "
         f"ops registered); workers: --dispatcher HOST:{port}, clients: "
         f"service='grpc://HOST:{port}'")
    _serve(server, "dispatcher", signals)
    return 0


def _worker(args, signals):
    for module in args.modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported, and the worker does not start
            _say(f"--import {module}: {type(exc).__name__}: {exc} (the worker imports "
                 f"it from the current directory and PYTHONPATH)", sys.stderr)
            return 2
    if args.trust_pickled:
        pyfunc_bridge.trust_pickled(True)
    service = tf.data.experimental.service
    try:
        # Returns once the worker has registered with the dispatcher.
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=args.dispatcher, worker_address=args.worker_address,
            port=args.port))
    except tf.errors.OpError as exc:
        _say(f"the worker could not start (dispatcher {args.dispatcher}, port "
             f"{args.port}): {exc.message}", sys.stderr)
        return 1
    trust = ("trusts pickled functions" if _portable.trusted()
             else "runs no pickled function")
    _say(f"worker {os.getpid()} registered with dispatcher {args.dispatcher}, "
         f"listening on port {server._address.rsplit(':', 1)[1]}; {trust}")
    _serve(server, "worker", signals)
    return 0


def main(argv=None):
    """Runs the launcher with `argv` (default: the command line); returns the
    exit status."""
    args = _parser().parse_args(argv)
    signals = _StopSignals()
    return (_dispatcher if args.command == "dispatcher" else _worker)(args, signals)


if __name__ == "__main__":
    sys.exit(main())
