"""The parent's side of one worker process: starting it (its shared memory,
its socket, the hello) and letting go of what it held once it ended."""
import mmap
import os
import socket
import subprocess
import sys
import threading
import weakref

from pyfunc_bridge.pool.spawn import spawner
from pyfunc_bridge.worker import start_worker
from pyfunc_bridge.worker.compiled import pool_module
from pyfunc_bridge.worker.frames import send

RING_SLOTS = 256  # per ring of a worker's control segment (16 KiB each)


def close_fd(owner, name):
    """Closes the descriptor in `owner`'s attribute `name`, if any, and sets
    it to None first: a Ctrl-C in between leaves nothing for the close that
    finishes this one to close twice."""
    fd = getattr(owner, name)
    setattr(owner, name, None)
    if fd is not None:
        os.close(fd)


def shared_memory(size, name):
    """(fd, mmap) of `size` bytes of anonymous shared memory."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


class WorkerProcess:
    """The parent's side of one worker process (`index`: its slot in `pool`;
    `read`: its reader thread's function)."""

    def __init__(self, pool, index, read):
        self.index = index
        # Held while a thread writes the socket (a payload), and by ended():
        # the descriptor is not closed under a write.
        self.write_lock = threading.Lock()
        self.alive = True
        self.ready = False
        # With a timeout: the call this worker was told off for, and where it
        # writes its stack when told to (Deadlines).
        self.timed_out = None  # that call's running_call (shm_layout.h)
        self.kill_at = None    # when it gets SIGKILL if its stack has not ended it
        self.trace_fd = None
        # Between calls: (Channel.unread, since when) while requests wait
        # unread on its ring (Deadlines).
        self.unread = None
        self.proc = None
        # The worker's control segment (src/pool/shm_layout.h: its running
        # call and its rings) and its doorbell, an eventfd this process owns
        # and writes after posting requests when the worker sleeps (it polls
        # it with its socket).  Kept until ended().
        self.channel = self.doorbell = None
        self.generation = None  # its attachment to the pool's dispatcher (_attach)
        result_fd = control_fd = parent = child = None
        try:
            result_fd, self.result_map = shared_memory(pool.arena_bytes,
                                                        f"{pool.name}-results")
            hello = {"path": list(sys.path)}
            if pool._deadlines is not None:
                self.trace_fd = pool._deadlines.prepare(hello, pool.name)
            pw = pool_module()
            control_fd, control = shared_memory(pw.control_bytes(RING_SLOTS),
                                                 f"{pool.name}-control")
            self.doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.channel = pw.Channel(control, create=True, ring_slots=RING_SLOTS,
                                      doorbell=self.doorbell)
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            # (The worker maps each segment whole: its size is the memfd's.)
            fds = [child.fileno(), pool._input_fd, result_fd, control_fd, self.doorbell]
            # This process's pid: the worker checks it after asking to die with
            # its parent (a parent that died before that has another pid).
            self.proc = spawner.popen(
                [sys.executable, start_worker.__file__, str(os.getpid()), *map(str, fds)],
                pass_fds=fds + ([] if self.trace_fd is None else [self.trace_fd]),
                cwd=os.getcwd(), stdin=subprocess.DEVNULL)
            child.close()  # the worker's now
            child = None
            self.sock = parent
            self.pid = self.proc.pid
            try:
                send(parent, hello)
            except (BrokenPipeError, ConnectionResetError):
                pass  # it died at once: its reader sees the end, as for a death just after
            # (The pool weakly: a pool dropped without close() is collected.)
            # read(pool_ref, worker), started by the pool's Supervisor once
            # the worker is attached.
            self.reader = threading.Thread(target=read,
                                           args=(weakref.ref(pool), self), daemon=True,
                                           name=f"{pool.name} reader {index}")
        except BaseException:
            # No reader will see this worker end (the hello failed, or its
            # start): it is ended here, and what it held closed.
            if self.proc is not None:
                self.kill_and_reap()
            for sock in (parent, child):
                if sock is not None:
                    sock.close()
            close_fd(self, "trace_fd")
            self._close_channel()
            raise
        finally:
            for fd in (result_fd, control_fd):
                if fd is not None:
                    os.close(fd)  # mapped here, and passed to the worker

    def kill_and_reap(self):
        """SIGKILL, then the exit code, waited for with os.waitpid: Popen.wait
        takes a lock that a KeyboardInterrupt between its acquire and its
        try leaves held, and every later wait on the process then hangs."""
        proc = self.proc
        proc.kill()
        while proc.returncode is None:
            try:
                _, status = os.waitpid(proc.pid, 0)
            except ChildProcessError:  # another wait reaped it first
                if proc.returncode is None:
                    proc.returncode = -9
            else:
                proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode

    def ended(self):
        """Lets go of what the parent holds of this worker once it has ended:
        its socket (under the write lock: no write is under way on the
        descriptor), and its result mapping, which stays mapped only while an
        output views one of its blocks (each _ResultBlock keeps it)."""
        with self.write_lock:
            self.sock.close()
        self.result_map = None
        self._close_channel()

    def _close_channel(self):
        if self.channel is not None:
            self.channel.close()  # any wait on either ring returns
            self.channel = None
        close_fd(self, "doorbell")
