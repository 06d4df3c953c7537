"""The script a worker process runs (``python <this file> PARENT_PID
SOCKET_FD INPUT_FD RESULT_FD CONTROL_FD DOORBELL_FD``, started by pyfunc_bridge/pool/worker_process.py,
which sends the hello, the first frame on its socket, that ``main`` reads).

Run by path, never as ``-m pyfunc_bridge.worker.start_worker``: importing
the package would import TensorFlow, which a worker never needs.  At module
level it imports the standard library and its sibling modules only; NumPy,
cloudpickle (through pickle), the compiled module and the user's function
load in ``main``.
"""
import os
import socket
import sys

if __name__ == "__main__":
    def _register_worker_package():
        """pyfunc_bridge.worker (this directory) without pyfunc_bridge's
        __init__, which imports TensorFlow: its modules then load by the
        names they have in the parent."""
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            "pyfunc_bridge.worker", os.path.join(here, "__init__.py"),
            submodule_search_locations=[here])
        package = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
    _register_worker_package()
    # This directory, whose module names would shadow the user's; the
    # parent's sys.path replaces the rest (main).
    del sys.path[0]

from pyfunc_bridge.worker.compiled import pool_module  # noqa: E402
from pyfunc_bridge.worker.frames import FrameReader, send  # noqa: E402


def _batch_policy():
    """Runs this worker under SCHED_BATCH (Linux): a batch process
    does not preempt the thread that wakes it.  Without it, a parent thread
    that had just written a request was preempted by the worker it woke, on
    its own core, holding the GIL, so no other call's request or reply moved
    until the function returned: the two workers then ran one at a time
    (~960 elements/s instead of ~1250 in the gil_bound map, for whole runs)."""
    try:  # (Linux has both, as it has the eventfd the worker sleeps on)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        pass  # refused (a seccomp policy): the default policy works, more slowly


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid, signal):
    """Has the kernel kill this process when its parent dies, whatever the
    function it is running does (a function that sleeps or loops never reads
    the end of its socket).  The parent may have died before this ran: then
    this process has another parent already, and ends now."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as exc:  # not Linux: the socket's end still ends it
        print(f"pyfunc_bridge worker: cannot ask to die with the parent ({exc}); a "
              f"worker busy in a function outlives a killed parent", file=sys.stderr)
    if os.getppid() != parent_pid:
        os._exit(0)


def main(argv):
    import mmap
    import signal
    _die_with_parent(int(argv[1]), signal)
    # Ctrl-C reaches the whole process group: the parent decides when
    # workers end (it closes the socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock_fd, input_fd, result_fd, control_fd, doorbell_fd = (int(a) for a in argv[2:7])
    sock = socket.socket(fileno=sock_fd)
    reader = FrameReader(sock)
    frames = reader.read()  # the hello
    if not frames:
        return 0
    (hello,) = frames
    # The parent's imports must resolve here as there (its sys.path; the
    # working directory is inherited).
    sys.path[:] = hello["path"]
    _batch_policy()
    import numpy as np

    from pyfunc_bridge.worker.memory import WorkerMemory
    from pyfunc_bridge.worker.ring_server import RingServer
    maps = []
    for fd in (input_fd, result_fd, control_fd):
        maps.append(mmap.mmap(fd, 0))  # whole: its size is the memfd's
        os.close(fd)
    pw = pool_module()
    ring = RingServer(WorkerMemory(np, maps[0], maps[1]), pw, pw.Channel(maps[2]),
                      doorbell_fd, sock, reader)
    deadlines = hello.get("deadlines")
    if deadlines is not None:
        # A pool with a timeout: on its watchdog's SIGUSR1 this worker writes
        # its Python stack to its trace file, then dies of the signal (chain).
        import faulthandler
        faulthandler.register(signal.SIGUSR1, file=deadlines["trace_fd"], all_threads=True,
                              chain=True)
        ring.load_grace_ns = deadlines["load_grace_ns"]
    try:
        send(sock, ("ready", os.getpid()))
        ring.run()
    except (ConnectionError, EOFError):
        # The pool closed (maybe before this worker was ready: EOFError is the
        # pool module's ChannelClosed), or the parent is gone.
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
