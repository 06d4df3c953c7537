# Errors, mapped in one place: Python exception -> TensorFlow error code
# (ERROR_CODES, the one table in this direction, for every kernel), what
# eager calls raise instead (_eager_raised: the function's exception, as it
# is or combined with the TF error class of its code) and,
# for the eager paths, status code -> TF's exception (_tf_error).  Codes are
# TensorFlow's (tensorflow/core/protobuf/error_codes.proto).

# The pool's errors live in the pool, in a module that imports only the
# standard library (pyfunc_bridge/pool/errors.py).
from pyfunc_bridge.pool.errors import ERROR_CODES as _POOL_ERROR_CODES
from pyfunc_bridge.pool.errors import POOL_ERRORS, PoolClosedError

cdef enum:
    TF_UNKNOWN = 2
    TF_INVALID_ARGUMENT = 3
    TF_RESOURCE_EXHAUSTED = 8
    TF_OUT_OF_RANGE = 11
    TF_UNIMPLEMENTED = 12
    TF_INTERNAL = 13

# Checked in order; anything else is UNKNOWN.
ERROR_CODES = (
    (_UnsupportedOutput, TF_INTERNAL),  # as TF's numpy_function reports them
    *_POOL_ERROR_CODES,  # the pool's own errors, whose rows the pool keeps (pool/errors.py)
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


cdef object _eager_raised(PfbCall* call, object exc, int code, str message):
    """What an eager call raises in place of the TF error of `code` (None:
    that error itself).  TensorFlow's eager numpy_function and py_func raise
    the function's own exception as it is; a graph raises the TF error of its
    code.  So an eager numpy_function / py_func / array_function (pooled or
    not) raises the function's exception as an instance of both its class and
    that TF error class (_combined_error), which code written for either
    catches; a BaseException that is no Exception (SystemExit,
    KeyboardInterrupt) and a TF error (a nested call's combined one too) as
    they are; an error of the bridge's own (a result that does not match its
    declaration: classes of pyfunc_bridge) as the TF error, but a pool's
    error (pfb.WorkerError, ...) combined, so that users catch it by name.
    py_function calls and their gradients raise the TF error, as TF's eager
    py_function does."""
    global _OpError
    if call.flags & (PFB_CALL_TENSORS | PFB_CALL_GRADIENT):
        return None
    if not isinstance(exc, Exception):
        return exc
    if _OpError is None:
        from tensorflow.python.framework.errors_impl import OpError
        _OpError = OpError
    if isinstance(exc, _OpError):
        return exc
    if (type(exc).__module__.partition(".")[0] == "pyfunc_bridge"
            and not isinstance(exc, POOL_ERRORS)):
        return None
    return _combined_error(exc, code, message)


# (function's exception class, TF error class) -> their combined class, or
# None where they cannot be combined; one class per pair, made on first use.
cdef dict _combined_classes = {}


cdef object _combined_class(type exc_type, type tf_type):
    """The class that subclasses both `exc_type` (first: its methods and
    attributes win) and `tf_type`, or None where Python refuses to make it
    (incompatible instance layouts, a metaclass conflict, a class that
    refuses subclasses, as an __init_subclass__ that raises)."""
    key = (exc_type, tf_type)
    try:
        return _combined_classes[key]
    except KeyError:
        pass
    if issubclass(tf_type, exc_type):
        return None  # (Exception) the TF error is an instance of both already
    import types
    name = f"{exc_type.__name__}[{tf_type.__name__}]"

    def body(ns):
        ns["__module__"] = "pyfunc_bridge"
        ns["__qualname__"] = name
        ns["__doc__"] = (f"{exc_type.__qualname__} raised by the function of an eager "
                         f"pyfunc_bridge call, also a tf.errors.{tf_type.__name__}.")
        # str() is TensorFlow's: the message, which holds the Python traceback.
        ns["__str__"] = _OpError.__str__
    try:
        made = types.new_class(name, (exc_type, tf_type), exec_body=body)
    except Exception:  # noqa: BLE001 - any refusal: the TF error alone
        made = None
    return _combined_classes.setdefault(key, made)


cdef object _combined_error(object exc, int code, str message):
    """`exc` as an instance of its class and of the TF error class of `code`,
    with TF's attributes (message, node_def, op, error_code) and `exc`'s own
    (args, slots, __dict__), `exc` as its __cause__; None where the classes
    cannot be combined or the instance cannot be made.  The class's
    __init__ is not called: a function's exception may require arguments
    that its args do not give back."""
    _load_tf()
    tf_type = _error_types(code)
    cls = _combined_class(type(exc), tf_type)
    if cls is None:
        return None
    try:
        # __new__ with the args, as the class's own raise made it (OSError's
        # reads errno, strerror and filename from them).
        made = cls.__new__(cls, *exc.args)
        _copy_fields(exc, made)
        tf_type.__init__(made, None, None, message)
        made.args = exc.args  # OpError's __init__ cleared them
    except Exception:  # noqa: BLE001 - a __new__ that refuses these args
        return None
    made.__cause__ = exc
    return made


cdef int _copy_fields(object exc, object made) except -1:
    """Copies `exc`'s attributes onto `made`: its slots (builtin exceptions
    keep theirs there: StopIteration.value, OSError.errno, a UnicodeError's
    fields, AttributeError.name), then its __dict__."""
    import types
    for klass in type(exc).__mro__:
        if klass is BaseException or klass is object:
            continue
        for name, member in vars(klass).items():
            if isinstance(member, types.MemberDescriptorType):
                try:
                    setattr(made, name, getattr(exc, name))
                except AttributeError:
                    pass  # unset, or read-only
    made.__dict__.update(exc.__dict__)
    return 0


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
