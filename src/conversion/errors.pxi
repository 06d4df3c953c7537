# Errors, mapped in one place: Python exception -> TensorFlow error code
# (ERROR_CODES, the one table in this direction, for every kernel), the
# exceptions eager calls re-raise as they are instead (_raised_as_is) and,
# for the eager paths, status code -> TF's exception (_tf_error).  Codes are
# TensorFlow's (tensorflow/core/protobuf/error_codes.proto).

from pyfunc_bridge._errors import CallTimeoutError, PoolClosedError

cdef enum:
    TF_UNKNOWN = 2
    TF_INVALID_ARGUMENT = 3
    TF_DEADLINE_EXCEEDED = 4
    TF_FAILED_PRECONDITION = 9
    TF_RESOURCE_EXHAUSTED = 8
    TF_OUT_OF_RANGE = 11
    TF_UNIMPLEMENTED = 12
    TF_INTERNAL = 13

# Checked in order; anything else is UNKNOWN.
ERROR_CODES = (
    (_UnsupportedOutput, TF_INTERNAL),  # as TF's numpy_function reports them
    (CallTimeoutError, TF_DEADLINE_EXCEEDED),  # a ProcessPool's timeout, never the function's
    (PoolClosedError, TF_FAILED_PRECONDITION),  # a call on a closed ProcessPool, whenever it closed
    ((ValueError, TypeError), TF_INVALID_ARGUMENT),
    (StopIteration, TF_OUT_OF_RANGE),
    (MemoryError, TF_RESOURCE_EXHAUSTED),
    (NotImplementedError, TF_UNIMPLEMENTED),
)

_READ_ONLY_HINT = (
    "under copy=False pyfunc_bridge passes inputs as read-only views of "
    "TensorFlow's memory; use copy=None (the default) to receive writable inputs "
    "(copied only where TensorFlow shares them), or copy the array yourself "
    "(arr.copy())")


# The frames of this module's code (Cython's traceback entries) run in its
# globals: that, not a file name, marks them as the bridge's own.
cdef dict _MODULE_GLOBALS = globals()


def error_code(exc):
    """The TensorFlow error code for a Python exception.

    >>> error_code(ValueError("bad")), error_code(KeyError("k"))
    (3, 2)
    """
    for types, code in ERROR_CODES:
        if isinstance(exc, types):
            return code
    return TF_UNKNOWN


def error_message(exc):
    """The TF error message: the exception, then the Python traceback.

    NUL bytes are written as ``\\x00``: TensorFlow's status messages end at
    the first NUL on their way to Python, which would cut the rest of the
    message and the traceback.
    """
    return _error_text(exc).replace("\0", "\\x00")


cdef str _error_text(exc):
    summary = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    if isinstance(exc, _OutputError):
        return "pyfunc_bridge: " + summary.partition(": ")[2]
    if isinstance(exc, PoolClosedError):
        return summary  # the pool's state, which the message says: its frames are the pool's
    if isinstance(exc, ValueError) and "read-only" in str(exc):
        summary += "\nHint: " + _READ_ONLY_HINT
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals is _MODULE_GLOBALS:
        tb = tb.tb_next  # the bridge's own frames say nothing to the user
    frames = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"{summary}\n\n{frames}".rstrip()


cdef tuple _status_of(object exc):
    """(TF error code, message) of an exception; never raises."""
    try:
        return error_code(exc), error_message(exc)
    except BaseException:
        return TF_UNKNOWN, "pyfunc_bridge: the error could not be formatted"


cdef object _OpError = None  # tf.errors.OpError, on first use


cdef bint _raised_as_is(PfbCall* call, object exc) except -1:
    """Whether an eager call re-raises `exc`, the function's own exception, as
    it is instead of the TF error of its code, as TensorFlow's eager
    numpy_function and py_func do for the exceptions the table above would
    turn into another class: a BaseException that is no Exception (SystemExit,
    KeyboardInterrupt) and a TF error (which keeps its class).  py_function
    calls and their gradients map them, as TF's eager py_function does."""
    global _OpError
    if call.flags & (PFB_CALL_TENSORS | PFB_CALL_GRADIENT):
        return False
    if not isinstance(exc, Exception):
        return True
    if _OpError is None:
        from tensorflow.python.framework.errors_impl import OpError
        _OpError = OpError
    return isinstance(exc, _OpError)


cdef void _set_status(PfbStatus* status, object code, object message) noexcept:
    """Fills `status` from _status_of's (code, message); never raises."""
    cdef bytes text
    status.code = code
    try:
        text = message.encode("utf-8", "replace")
    except BaseException:
        text = b"pyfunc_bridge: the error could not be formatted"
    status.message = <char*>malloc(len(text) + 1)
    if status.message != NULL:
        memcpy(status.message, <const char*>text, len(text) + 1)


cdef object _unsupported_value_error = None


cdef object _tf_error(int code, str message):
    """The TF exception of a status code, as an eager op raises it.

    INTERNAL (a result without a tensor form: _UnsupportedOutput) is raised
    as a subclass of both InternalError (what TF's numpy_function raises in a
    graph) and ValueError (what it raises eagerly), so code written for
    either catches it."""
    global _unsupported_value_error
    _load_tf()
    if code != TF_INTERNAL:
        return _error_types(code)(None, None, message)
    if _unsupported_value_error is None:
        class UnsupportedValueError(_error_types(TF_INTERNAL), ValueError):
            """A result of the function that has no tensor form (pyfunc_bridge)."""
        UnsupportedValueError.__module__ = "pyfunc_bridge"
        _unsupported_value_error = UnsupportedValueError
    return _unsupported_value_error(None, None, message)


def eager_error(int code, str message):
    """_tf_error, for the op layer's dispatched eager calls (pyfunc_bridge/_op.py):
    both eager paths raise the same classes."""
    return _tf_error(code, message)
