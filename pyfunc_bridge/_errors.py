"""Error classes that span two of Python's built-in ones, so that code written
against either TensorFlow behaviour catches them.  (The eager error for a
result without a tensor form, an InternalError and a ValueError, subclasses a
TensorFlow class: it is made with the other eager errors, in the conversion
layer's errors.pxi.  The pool's errors are the pool's: pool/errors.py.)"""


class NotCallableError(ValueError, TypeError):
    """``func`` is not callable.

    TensorFlow raises ValueError for it where it builds an op (graphs, and
    ``tf.py_function`` everywhere) and TypeError where it calls the function
    at once (eager ``tf.numpy_function``); this is both.  Raised by
    ``_op.check_callable``, for every API.

    >>> issubclass(NotCallableError, ValueError), issubclass(NotCallableError, TypeError)
    (True, True)
    """
