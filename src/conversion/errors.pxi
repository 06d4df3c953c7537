# Python exception -> TensorFlow error code: the one table in this direction.
# Codes are TensorFlow's (tensorflow/core/protobuf/error_codes.proto).

cdef enum:
    TF_UNKNOWN = 2
    TF_INVALID_ARGUMENT = 3
    TF_RESOURCE_EXHAUSTED = 8
    TF_OUT_OF_RANGE = 11
    TF_UNIMPLEMENTED = 12

# Checked in order; anything else is UNKNOWN.
ERROR_CODES = (
    ((ValueError, TypeError), TF_INVALID_ARGUMENT),
    (StopIteration, TF_OUT_OF_RANGE),
    (MemoryError, TF_RESOURCE_EXHAUSTED),
    (NotImplementedError, TF_UNIMPLEMENTED),
)

_READ_ONLY_HINT = (
    "pyfunc_bridge passes inputs as read-only views of TensorFlow's memory; use "
    "copy=True to receive private writable copies, or copy the array yourself "
    "(arr.copy())")


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
    if isinstance(exc, ValueError) and "read-only" in str(exc):
        summary += "\nHint: " + _READ_ONLY_HINT
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(".pxi"):
        tb = tb.tb_next  # the bridge's own frames say nothing to the user
    frames = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"{summary}\n\n{frames}".rstrip()


cdef void _set_status(PfbStatus* status, object exc) noexcept:
    """Fills `status` from an exception; never raises."""
    cdef bytes text
    try:
        status.code = error_code(exc)
        text = error_message(exc).encode("utf-8", "replace")
    except BaseException:
        status.code = TF_UNKNOWN
        text = b"pyfunc_bridge: the error could not be formatted"
    status.message = <char*>malloc(len(text) + 1)
    if status.message != NULL:
        memcpy(status.message, <const char*>text, len(text) + 1)
