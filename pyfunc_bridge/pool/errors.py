"""The pool's errors (public as ``pfb.WorkerError``, ``pfb.CallTimeoutError``
and ``pfb.PoolClosedError``), and how a worker's exception or a dispatcher's
failure becomes one in this process.

It imports only the standard library: the conversion layer maps these
classes to TensorFlow's codes (src/conversion/errors.pxi), and a worker may
unpickle them.  An eager call raises one as an instance of both its class and
the TensorFlow error of its code; a graph or tf.data raises that TensorFlow
error, whose message starts with the class's full name."""
import builtins
import pickle

# TensorFlow's codes of the pool's errors (ERROR_CODES).
UNKNOWN, DEADLINE_EXCEEDED, FAILED_PRECONDITION = 2, 4, 9

# The reason a pool closed at interpreter exit gives (_close_pools).
EXIT_TEXT = "was closed at interpreter exit"


class WorkerError(RuntimeError):
    """A worker process ended while it held the call (killed, crashed,
    ``os._exit``), or a broken pool (whose workers cannot start) had no
    worker for it.  The pool replaces the worker, so later calls run; the
    calls the worker held but had not started run in another.  TensorFlow's
    code: UNKNOWN (``tf.errors.UnknownError``).

    >>> import os, tensorflow as tf
    >>> import pyfunc_bridge as pfb
    >>> with pfb.ProcessPool(1) as pool:
    ...     try:
    ...         pfb.numpy_function(os._exit, [tf.constant(3)], tf.int32, executor=pool)
    ...     except pfb.WorkerError as e:
    ...         print("exited with status 3" in str(e), isinstance(e, tf.errors.UnknownError))
    True True
    """


class CallTimeoutError(TimeoutError):
    """A call ran past its ``ProcessPool``'s ``timeout``; the worker that ran
    it was ended (and is replaced), and the message holds the function's
    Python stack at that moment.  The one exception that maps to
    TensorFlow's DEADLINE_EXCEEDED: a ``TimeoutError`` that a function raises
    itself stays UNKNOWN, as with ``tf.numpy_function``.

    >>> import time, tensorflow as tf
    >>> import pyfunc_bridge as pfb
    >>> def nap(seconds):
    ...     time.sleep(float(seconds))
    ...     return seconds
    >>> with pfb.ProcessPool(1, timeout=0.5) as pool:
    ...     try:
    ...         pfb.numpy_function(nap, [tf.constant(30.0)], tf.float32, executor=pool)
    ...     except pfb.CallTimeoutError as e:
    ...         print("0.5 s timeout" in str(e), isinstance(e, tf.errors.DeadlineExceededError))
    True True
    """


class PoolClosedError(RuntimeError):
    """A call on a closed ``ProcessPool`` (closed by ``close()``, before the
    call or while it ran, at interpreter exit, or a pool of the parent in a
    forked child).  Every such call fails with it, whenever the pool closed;
    its message names the pool and says how to go on.  TensorFlow's code:
    FAILED_PRECONDITION (``tf.errors.FailedPreconditionError``).

    >>> import numpy as np, tensorflow as tf
    >>> import pyfunc_bridge as pfb
    >>> pool = pfb.ProcessPool(1)
    >>> pool.close()
    >>> try:
    ...     pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32, executor=pool)
    ... except pfb.PoolClosedError as e:
    ...     print(isinstance(e, tf.errors.FailedPreconditionError))
    True
    """


# The pool's own errors: the eager calls' combined classes and dispatch_error.
POOL_ERRORS = (WorkerError, CallTimeoutError, PoolClosedError)

# The pool's rows of the one table of Python exception -> TensorFlow code
# (src/conversion/errors.pxi, ERROR_CODES, takes them first), which a call
# the dispatcher fails gets too (error_code); WorkerError is UNKNOWN.
ERROR_CODES = (
    (CallTimeoutError, DEADLINE_EXCEEDED),  # a ProcessPool's timeout, never the function's
    (PoolClosedError, FAILED_PRECONDITION),  # a call on a closed ProcessPool, whenever it closed
)


def error_code(error):
    """TensorFlow's code of one of the pool's errors."""
    return next((code for cls, code in ERROR_CODES if isinstance(error, cls)), UNKNOWN)


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
    for cls in POOL_ERRORS:
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
