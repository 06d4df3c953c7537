"""Error classes that span two of Python's built-in ones, so that code written
against either TensorFlow behaviour catches them."""


class NotCallableError(ValueError, TypeError):
    """``func`` is not callable.

    TensorFlow raises ValueError for it where it builds an op (graphs, and
    ``tf.py_function`` everywhere) and TypeError where it calls the function
    at once (eager ``tf.numpy_function``); this is both.

    >>> issubclass(NotCallableError, ValueError), issubclass(NotCallableError, TypeError)
    (True, True)
    """


def check_callable(func):
    """Raises NotCallableError unless `func` is callable.

    >>> check_callable(3)
    Traceback (most recent call last):
    ...
    pyfunc_bridge._errors.NotCallableError: Expected func to be callable, got int: 3; pass a function or an object with __call__
    """
    if not callable(func):
        raise NotCallableError(
            f"Expected func to be callable, got {type(func).__name__}: {func!r}; "
            f"pass a function or an object with __call__")
