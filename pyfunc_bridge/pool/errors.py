"""The pool's errors, and how a worker's exception or a dispatcher's
failure becomes one in this process."""
import builtins
import pickle

from pyfunc_bridge._errors import CallTimeoutError, PoolClosedError  # noqa: F401 (the pool's)

# TensorFlow's codes of the pool's errors, as src/conversion/errors.pxi maps them.
UNKNOWN, DEADLINE_EXCEEDED, FAILED_PRECONDITION = 2, 4, 9

# The reason a pool closed at interpreter exit gives (_close_pools).
EXIT_TEXT = "was closed at interpreter exit"


class WorkerError(RuntimeError):
    """A worker process ended while it held the call (killed, crashed,
    ``os._exit``).  The pool replaces it; later calls run."""


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker, attached as its
    ``__cause__`` so that the TF error's message shows where it was raised."""

    def __str__(self):
        return "the traceback in the worker process:\n\n" + self.args[0].rstrip()


def dispatch_error(code, text):
    """The exception of a call the dispatcher failed (its worker died, or the
    pool closed): `text` is the one the pool gave it (_detach), "module.Class:
    message", rebuilt as that class where it is one of the pool's."""
    name, _, message = text.partition(": ")
    for cls in (WorkerError, PoolClosedError, CallTimeoutError):
        if name == f"{cls.__module__}.{cls.__qualname__}":
            return cls(message)
    # (The dispatcher's own text: a call its close ended.)
    return PoolClosedError(text) if code == FAILED_PRECONDITION else WorkerError(text)


def raise_acyclic(error):
    """Raises `error` with no frame of its traceback holding it: the error's
    traceback holds the frames it passes, and a frame that held the error
    too would make a cycle, which kept the pool, the caller's frames and the
    results they hold (their workers' shared memory) until the next garbage
    collection.  Pass the error as an expression, or clear the caller's
    local: this frame clears its own."""
    try:
        raise error
    finally:
        error = None


def worker_exception(payload):
    """The exception a worker raised, rebuilt here (or as its builtin base
    class with the same message), with the worker's traceback as its cause."""
    data, base, summary, text = payload
    exc = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:  # noqa: BLE001 - rebuilt from its base class below
            exc = None
    if not isinstance(exc, BaseException):
        exc = getattr(builtins, base, Exception)(summary)
    exc.__cause__ = WorkerTraceback(text)
    return exc
