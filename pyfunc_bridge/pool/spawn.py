"""The thread that starts every worker process of this process's pools
(pool/supervision.py runs each start there, ``spawner.run``)."""
import _thread
import queue
import subprocess
import threading


class Spawner:
    """Starts the worker processes, all from one thread that lives as long as
    this process.  A worker asks the kernel to kill it when its parent dies
    (PR_SET_PDEATHSIG, pyfunc_bridge/worker/start_worker.py); the kernel's "parent" is
    the *thread* that started it, and the threads that start workers come
    and go (a tf.data thread's first call, a reader thread replacing a dead
    worker): a worker started by one of them would be killed with it.

    A pool starts each worker there as a whole (run): a Ctrl-C can land only
    in the caller's wait, and the start runs on to its end and puts the
    worker in its pool, so no process is left that its pool does not know."""

    def __init__(self):
        self._lock = threading.Lock()
        self._requests = queue.SimpleQueue()  # what the thread, once started, runs
        self._thread = None
        # Held by a start from its worker's first descriptor until the pool
        # has the worker, and by a fork until it returns (the hooks below): a
        # forked child closes the descriptors of the workers its parent's
        # pools have (Supervisor.forked), and no other.  Reentrant: a fork
        # on this thread meanwhile does not wait for itself.
        self.descriptors = threading.RLock()
        self._interrupted = False  # a Ctrl-C came while a fork waited

    def run(self, function, *args, **kwargs):
        """function(*args, **kwargs) on the spawning thread: its value, or its
        exception raised here.  A caller interrupted while it waits leaves
        the call running to its end (which must record what it made)."""
        if self.on_thread():
            return function(*args, **kwargs)
        reply = queue.SimpleQueue()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, args=(self._requests,),
                                                name="pyfunc_bridge worker spawner",
                                                daemon=True)
                self._thread.start()
            self._requests.put((function, args, kwargs, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def on_thread(self):
        """Whether this is the spawning thread."""
        return threading.current_thread() is self._thread

    def popen(self, args, **kwargs):
        """subprocess.Popen(args, **kwargs), run by the spawning thread."""
        return self.run(subprocess.Popen, args, **kwargs)

    @staticmethod
    def _serve(requests):
        while True:
            function, args, kwargs, reply = requests.get()
            try:
                reply.put((True, function(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                reply.put((False, exc))
            del function, args, kwargs, reply  # nothing of a request outlives it here

    def before_fork(self):
        """Waits for a start that holds descriptors (the first fork hook to
        run, process_pool's).  A hook cannot raise: a Ctrl-C meanwhile is
        raised again once the fork is done (after_fork_in_parent), and the
        wait goes on."""
        self._interrupted = False
        while True:
            try:
                self.descriptors.acquire()
                return
            except KeyboardInterrupt:
                self._interrupted = True
                if self.descriptors._is_owned():  # it came once the lock was taken
                    return

    def after_fork_in_parent(self):
        """The last fork hook to run in the parent."""
        self.descriptors.release()
        if self._interrupted:
            self._interrupted = False
            # Later, from another thread: raised in a hook, it would be ignored
            # (the hooks left take microseconds; should one outlast the delay,
            # the Ctrl-C is reported as ignored, as it would be without this).
            timer = threading.Timer(0.01, _thread.interrupt_main)
            timer.daemon = True
            timer.start()

    def after_fork_in_child(self):
        """The spawning thread is not in a forked child: the child starts its
        own, and its lock is new."""
        self.__init__()


spawner = Spawner()
