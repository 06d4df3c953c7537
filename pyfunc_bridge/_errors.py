"""Error classes that span two of Python's built-in ones, so that code written
against either TensorFlow behaviour catches them.  (The eager error for a
result without a tensor form, an InternalError and a ValueError, subclasses a
TensorFlow class: it is made with the other eager errors, in the conversion
layer's errors.pxi.)"""


class NotCallableError(ValueError, TypeError):
    """``func`` is not callable.

    TensorFlow raises ValueError for it where it builds an op (graphs, and
    ``tf.py_function`` everywhere) and TypeError where it calls the function
    at once (eager ``tf.numpy_function``); this is both.  Raised by
    ``_op.check_callable``, for every API.

    >>> issubclass(NotCallableError, ValueError), issubclass(NotCallableError, TypeError)
    (True, True)
    """


class PoolClosedError(RuntimeError):
    """A call on a closed ``ProcessPool`` (closed by ``close()``, before the
    call or while it ran, or at interpreter exit).  Every such call fails
    with it, whenever the pool closed; it maps to TensorFlow's
    FAILED_PRECONDITION (src/conversion/errors.pxi), so that an eager call,
    a graph and tf.data raise ``tf.errors.FailedPreconditionError`` with its
    message, which names the pool and says how to go on.

    >>> issubclass(PoolClosedError, RuntimeError)
    True
    """


class CallTimeoutError(TimeoutError):
    """A call ran past its ``ProcessPool``'s ``timeout``; the worker that ran
    it was ended.  The one exception that maps to TensorFlow's
    DEADLINE_EXCEEDED (src/conversion/errors.pxi): a ``TimeoutError`` that a
    function raises itself stays UNKNOWN, as with ``tf.numpy_function``.

    >>> issubclass(CallTimeoutError, TimeoutError)
    True
    """
