"""The function's own exception, eagerly: TensorFlow's eager numpy_function
and py_func raise it as it is, a graph raises the TF error of its code.  An
eager pfb call raises one exception that is both (errors.pxi,
_eager_raised), so code written for either contract catches it; graphs, and
py_function everywhere, raise TensorFlow's class, as TF does."""
import pytest
import tensorflow as tf

import process_functions as pf
import pyfunc_bridge as pfb
from conftest import API_PAIRS, error_of, raising

NUMPY_APIS = ["numpy_function", "py_func", "array_function"]


class CustomError(Exception):
    pass


class TwoArgError(Exception):
    """Its __init__ needs two arguments its args do not give back."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")
        self.a, self.b = a, b


class SlottedError(LookupError):
    __slots__ = ("detail",)


def _slotted():
    exc = SlottedError("in a slot")
    exc.detail = "kept"
    return exc


# (the function's exception, the TF error class a graph raises for it)
EXCEPTIONS = {
    "ValueError": (lambda: ValueError("bad value"), tf.errors.InvalidArgumentError),
    "TypeError": (lambda: TypeError("bad type"), tf.errors.InvalidArgumentError),
    "KeyError": (lambda: KeyError("missing"), tf.errors.UnknownError),
    "StopIteration": (lambda: StopIteration(5), tf.errors.OutOfRangeError),
    "NotImplementedError": (lambda: NotImplementedError("later"),
                            tf.errors.UnimplementedError),
    "FileNotFoundError": (lambda: FileNotFoundError(2, "no file", "/x"),
                          tf.errors.UnknownError),
    "custom": (lambda: CustomError("custom"), tf.errors.UnknownError),
    "two_args": (lambda: TwoArgError(1, 2), tf.errors.UnknownError),
    "slotted": (_slotted, tf.errors.UnknownError),
}


def _func_that_raises(exc):
    def user_function_that_raises(a):
        raise exc
    return user_function_that_raises


@pytest.mark.parametrize("kind", sorted(EXCEPTIONS))
@pytest.mark.parametrize("op", NUMPY_APIS)
def test_an_eager_call_raises_the_functions_class_and_tensorflows(op, kind, eager_path):
    ours, theirs = API_PAIRS[op]
    make, tf_error = EXCEPTIONS[kind]
    exc_type = type(make())
    # TensorFlow's eager call raises the function's exception itself.
    assert type(error_of(theirs, raising(make()), "eager")) is exc_type
    exc = make()
    got = error_of(ours, _func_that_raises(exc), "eager")
    # Caught by `except` for the function's class, TF's class, and OpError.
    assert isinstance(got, exc_type) and isinstance(got, tf_error)
    assert isinstance(got, tf.errors.OpError)
    # As the function raised it: its args and its attributes, itself as the cause.
    assert got.args == exc.args
    assert got.__cause__ is exc
    if kind == "two_args":
        assert (got.a, got.b) == (1, 2)
    if kind == "slotted":
        assert got.detail == "kept"
    if kind == "StopIteration":
        assert got.value == 5
    if kind == "FileNotFoundError":
        assert (got.errno, got.strerror, got.filename) == (2, "no file", "/x")
    # TensorFlow's attributes, the message holding the Python traceback.
    assert got.error_code == tf_error(None, None, "").error_code
    assert got.node_def is None and got.op is None
    assert "Traceback (most recent call last)" in got.message
    assert "user_function_that_raises" in got.message
    assert f"{exc_type.__name__}" in got.message
    assert str(got) == got.message


@pytest.mark.parametrize("op", NUMPY_APIS)
def test_except_clauses_written_for_either_contract_run(op):
    ours = API_PAIRS[op][0]
    x = tf.constant([1.0])
    try:
        ours(raising(ValueError("v")), [x], tf.float32)
    except ValueError:
        caught = "ValueError"
    assert caught == "ValueError"
    try:
        ours(raising(ValueError("v")), [x], tf.float32)
    except tf.errors.InvalidArgumentError:
        caught = "InvalidArgumentError"
    assert caught == "InvalidArgumentError"
    try:
        ours(raising(KeyError("k")), [x], tf.float32)
    except KeyError as err:
        caught = err.args[0]
    assert caught == "k"


def test_the_combined_class_is_made_once_per_pair():
    x = tf.constant([1.0])
    seen = set()
    for op in NUMPY_APIS:
        for _ in range(3):
            seen.add(type(error_of(API_PAIRS[op][0], raising(CustomError("c")), "eager")))
    assert len(seen) == 1
    other = type(error_of(pfb.numpy_function, raising(KeyError("k")), "eager", x))
    assert other not in seen


@pytest.mark.parametrize("kind", ["ValueError", "KeyError", "custom", "two_args"])
@pytest.mark.parametrize("op", sorted(API_PAIRS))
def test_graphs_raise_tensorflows_class(op, kind):
    ours, theirs = API_PAIRS[op]
    make, tf_error = EXCEPTIONS[kind]
    want = error_of(theirs, raising(make()), "graph")
    got = error_of(ours, raising(make()), "graph")
    assert type(got) is type(want) is tf_error


@pytest.mark.parametrize("kind", ["ValueError", "KeyError", "custom", "two_args"])
def test_an_eager_py_function_raises_tensorflows_class_as_tf_does(kind, eager_path):
    ours, theirs = API_PAIRS["py_function"]
    make, tf_error = EXCEPTIONS[kind]
    want = error_of(theirs, raising(make()), "eager")
    got = error_of(ours, raising(make()), "eager")
    assert type(got) is type(want) is tf_error


class RefusesSubclasses(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError("no subclasses")


class _Final(type):
    def __new__(mcs, name, bases, ns):
        if any(isinstance(b, _Final) for b in bases):
            raise TypeError("final")
        return super().__new__(mcs, name, bases, ns)


class FinalError(Exception, metaclass=_Final):
    pass


class RefusesArgs(Exception):
    def __new__(cls, *args):
        if cls is not RefusesArgs:
            raise TypeError("only RefusesArgs itself")
        return super().__new__(cls, *args)


@pytest.mark.parametrize("exc", [RefusesSubclasses("r"), FinalError("f"), RefusesArgs("a"),
                                 Exception("plain")], ids=lambda e: type(e).__name__)
def test_a_class_that_cannot_be_combined_raises_tensorflows_alone(exc):
    got = error_of(pfb.numpy_function, raising(exc), "eager")
    assert type(got) is tf.errors.UnknownError
    assert type(exc).__name__ in got.message and "Traceback" in got.message


def test_a_nested_call_passes_the_inner_exception_through():
    def outer(a):
        return pfb.numpy_function(raising(TwoArgError(3, 4)), [a], tf.float32)
    got = error_of(pfb.numpy_function, lambda a: outer(tf.constant(a)), "eager")
    assert isinstance(got, TwoArgError) and isinstance(got, tf.errors.UnknownError)
    assert (got.a, got.b) == (3, 4)


def test_the_bridges_own_errors_keep_tensorflows_class():
    # A result that does not match its declaration is the bridge's report.
    got = error_of(pfb.numpy_function, lambda a: (a, a), "eager")
    assert type(got) is tf.errors.InvalidArgumentError


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name="eager exceptions pool") as shared:
        yield shared


@pytest.mark.parametrize("func, exc_type, tf_error", [
    (pf.raises_value_error, ValueError, tf.errors.InvalidArgumentError),
    (pf.raises_key_error, KeyError, tf.errors.UnknownError),
    (pf.raises_custom, pf.WorkerCustomError, tf.errors.UnknownError),
], ids=["ValueError", "KeyError", "custom"])
def test_a_pooled_eager_call_raises_the_same_combined_class(pool, func, exc_type, tf_error):
    x = tf.constant([1.0])
    got = error_of(lambda f, inp, Tout: pfb.numpy_function(f, inp, Tout, executor=pool),
                   func, "eager", x)
    assert isinstance(got, exc_type) and isinstance(got, tf_error)
    # The class the same exception gets in this process.
    assert type(got) is type(error_of(pfb.numpy_function, func, "eager", x))
    assert "the traceback in the worker process" in got.message
    assert f"in {func.__name__}" in got.message
    if exc_type is pf.WorkerCustomError:
        assert got.code == 7
    # Graphs keep TensorFlow's class.
    graph = error_of(lambda f, inp, Tout: pfb.numpy_function(f, inp, Tout, executor=pool),
                     func, "graph", x)
    assert type(graph) is tf_error


def test_a_pooled_exception_that_does_not_unpickle_raises_tensorflows_class(pool):
    got = error_of(lambda f, inp, Tout: pfb.numpy_function(f, inp, Tout, executor=pool),
                   pf.raises_unpicklable, "eager")
    assert type(got) is tf.errors.UnknownError  # rebuilt as an Exception
    assert "one and two" in got.message
