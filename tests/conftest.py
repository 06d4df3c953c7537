"""Shared test setup: quiet TF logs, one import of TF and of the package."""
import contextlib
import gc
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A shell that runs the suite in the background (`pytest ... &`) ignores
# SIGINT in it, and every script a test starts would inherit that: the
# Ctrl-C tests need KeyboardInterrupt in their scripts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import pyfunc_bridge as pfb  # noqa: E402
from pool_checks import in_arena, memfd_mappings  # noqa: E402,F401 (shared with scripts)

# Property-based tests (tests/conversion/test_conversion_fuzz*.py).  "ci" is the default:
# deterministic (derandomized, no example database) and inside CI's minute;
# "long" explores deeper.  Pick one with --hypothesis-profile=long or the
# HYPOTHESIS_PROFILE environment variable.
try:
    from hypothesis import HealthCheck, settings

    _FUZZ = dict(deadline=None, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])
    settings.register_profile("ci", max_examples=150, derandomize=True, **_FUZZ)
    settings.register_profile("long", max_examples=10000, **_FUZZ)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # the fuzz tests skip without hypothesis
    pass


# The folder of the helper modules (this one, process_functions, travel_functions,
# pool_checks, dlpack_ctypes) that tests in the layer folders below, the fresh
# interpreters they start and pool workers import by name; the checkout above it.
TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The wheel CI leg (tools/test_wheel.sh) runs the suite from a copy of the
# checkout without pyfunc_bridge/: the package must be the installed one.
if os.environ.get("PFB_TEST_INSTALLED") == "1" and (
        os.path.realpath(os.path.dirname(os.path.dirname(pfb.__file__)))
        == os.path.realpath(ROOT)):
    raise RuntimeError(f"PFB_TEST_INSTALLED=1, but pyfunc_bridge was imported from the "
                       f"checkout ({pfb.__file__}), not from the installed wheel")

_GPUS = tf.config.list_physical_devices("GPU")
# The environment as the run began: a `gpu` test's fresh interpreter that must see the GPU.
GPU_ENV = dict(os.environ)
# The scripts tests run in fresh interpreters check CPU kernels too: their
# TensorFlow sees no GPU (this process's has initialized CUDA already).
if _GPUS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def script_env(*paths, **extra):
    """The environment for a fresh interpreter a test starts: `paths` ahead of
    the inherited PYTHONPATH (which may be where TensorFlow is), plus `extra`."""
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([*paths, inherited] if inherited else paths)
    return {**os.environ, **extra, "PYTHONPATH": path}


# PFB_PIN_CPU=1 pins as on a GPU machine, to check the pinning where there is none.
_PIN = bool(_GPUS) or os.environ.get("PFB_PIN_CPU") == "1"
_graph_as_default = tf.Graph.as_default


@contextlib.contextmanager
def _as_default_on_cpu(graph):
    """Graph.as_default that pins the graph's ops: a graph starts with no
    device scope, whatever scope was open when it was made."""
    with _graph_as_default(graph), graph.device("/CPU:0"):
        yield graph


@contextlib.contextmanager
def _on_cpu():
    """The CPU for eager ops, tf.function traces and graphs made meanwhile
    (TF1 graphs and Sessions)."""
    saved = tf.Graph.as_default
    tf.Graph.as_default = _as_default_on_cpu
    try:
        with tf.device("/CPU:0"):
            yield
    finally:
        tf.Graph.as_default = saved


def _pins(node):
    return _PIN and (node is None or node.get_closest_marker("gpu") is None)


@pytest.fixture(autouse=True)
def _cpu_placement(request):
    """Tests run on the CPU unless marked `gpu`: TF places ops on a GPU when
    there is one, and most tests check what a CPU kernel does (host memory,
    zero-copy addresses).  tests/gpu/test_gpu.py covers the GPU kernels."""
    if not _pins(request.node):
        yield
        return
    with _on_cpu():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Fixtures (of any scope: a module's is set up outside its tests' scope)
    compute on the CPU too, unless the test asking is marked `gpu`."""
    # _cpu_placement enters its own scope, which must stay open after its setup.
    if fixturedef.argname == "_cpu_placement" or not _pins(getattr(request, "node", None)):
        yield
        return
    with _on_cpu():
        yield


@pytest.fixture(params=["direct", "dispatched"])
def eager_path(request, monkeypatch):
    """Eager calls skip TF's op dispatch where TF has one CPU device; the
    dispatched op (GPU machines, async mode) must behave the same."""
    if request.param == "dispatched":
        monkeypatch.setattr(pfb._library.conversion(), "direct_eager_calls", lambda: False)
    return request.param


def without_op_label(message):
    """An eager error's message less the label TF's dispatched path wraps it
    in, which names the op's type: the same call may run another op (a pooled
    array_function runs numpy_function's CPU op)."""
    message = re.sub(r"^\{\{function_node [^}]*\}\} ", "", message)
    return re.sub(r" \[Op:[^\]]*\]( name: .*)?\Z", "", message, flags=re.S)


@pytest.fixture
def stats_on():
    """Statistics on and cleared for the test; the previous setting after it."""
    previous = pfb.enable_stats(True)
    pfb.reset_stats()
    yield
    pfb.reset_stats()
    pfb.enable_stats(previous)


@pytest.fixture
def registry():
    """The bridge's live registry dict (key -> weakref of an entry)."""
    return pfb._library.conversion().registry()


@pytest.fixture
def api():
    """The conversion layer's bridge API table, callable through ctypes."""
    import dlpack_ctypes as dl
    return dl.bridge_api(pfb._library.conversion()._bridge_api)


@pytest.fixture
def registered():
    """Registers functions for a test; returns their keys."""
    entries = []

    def register(func):
        entry = pfb._registry.register(func)
        entries.append(entry)
        return entry.key

    yield register
    entries.clear()


class UserValueError(ValueError):
    pass


# Python exception -> TF error class, the table in errors.pxi (subclasses map as their base).
EXCEPTION_TABLE = [
    (ValueError, tf.errors.InvalidArgumentError),
    (UserValueError, tf.errors.InvalidArgumentError),
    (TypeError, tf.errors.InvalidArgumentError),
    (StopIteration, tf.errors.OutOfRangeError),
    (MemoryError, tf.errors.ResourceExhaustedError),
    (NotImplementedError, tf.errors.UnimplementedError),
    (KeyError, tf.errors.UnknownError),
    (RuntimeError, tf.errors.UnknownError),
    (ZeroDivisionError, tf.errors.UnknownError),
]


def assert_mapped_with_traceback(err, tf_error, exc_type, marker, function_name,
                                 combined=False):
    """`err` is the TF error of `exc_type(marker)` raised in `function_name`;
    `combined`: an eager NumPy API's, which is an `exc_type` as well."""
    if combined:
        assert isinstance(err, tf_error) and isinstance(err, exc_type), type(err).__mro__
    else:
        assert type(err) is tf_error
    assert marker in err.message
    assert exc_type.__name__ in err.message
    assert "Traceback (most recent call last)" in err.message
    assert function_name in err.message


def as_list(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def assert_same(got, want):
    """Same structure (tensor vs list), dtypes, shapes and values."""
    assert isinstance(got, (list, tuple)) == isinstance(want, (list, tuple))
    got, want = as_list(got), as_list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def address(array_like):
    """Data address of an ndarray, or of a tensor viewed through NumPy."""
    return np.asarray(array_like).__array_interface__["data"][0]


def collect():
    for _ in range(3):
        gc.collect()


def input_arena_whole(pool, seconds=10):
    """Waits until `pool`'s input arena is whole again (its calls done, their
    blocks handed back: the worker's reply thread frees them a moment after
    a call returns); fails the test after `seconds`."""
    wait_for(lambda: pool.free_input_bytes == pool.arena_bytes, seconds)


def serving(pool, seconds=60):
    """Returns `pool` once each of its workers has answered a call, and so
    serves its rings (a call that finds no worker serving takes the Python
    path whole).  Rounds of calls that hold a worker for a moment, one per
    worker at once, reach every worker; fails the test after `seconds`."""
    import process_functions as pf

    def call(_):
        return int(pfb.numpy_function(pf.slow_pid, [tf.constant(0.05)], tf.int64,
                                      executor=pool))
    deadline = time.monotonic() + seconds
    answered = set()
    with ThreadPoolExecutor(pool.workers) as threads:
        while not pool.pids() or not set(pool.pids()) <= answered:
            if time.monotonic() > deadline:
                raise AssertionError(f"workers {sorted(set(pool.pids()) - answered)} "
                                     f"never answered")
            answered.update(threads.map(call, range(pool.workers)))
    return pool


def wait_for(condition, seconds=10):
    """Returns once `condition()` holds; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


# Optional frameworks (the `test` extra installs them): imported once, by the
# tests that ask for them, skipped cleanly when absent.
@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="session")
def jax():
    jax = pytest.importorskip("jax")
    import jax.dlpack  # noqa: F401
    import jax.numpy  # noqa: F401
    return jax


# Each public API beside TensorFlow's builtin, and the error a call raises.
def raising(exc):
    def func(*args):
        raise exc
    return func


# (ours, TensorFlow's) for each op; array_function is numpy_function's twin.
API_PAIRS = {
    "numpy_function": (pfb.numpy_function, tf.numpy_function),
    "py_func": (pfb.py_func, tf.compat.v1.py_func),
    "py_function": (pfb.py_function, tf.py_function),
    "array_function": (
        lambda f, inp, Tout: pfb.array_function(f, inp, Tout, framework="numpy"),
        tf.numpy_function),
}


def py_function_gradient(func):
    """A tf.function of x giving the gradient of pfb.py_function(func, [x],
    tf.float32) with respect to x (the gradient op runs in the graph)."""
    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(func, [x], tf.float32)
        return tape.gradient(y, x)
    return gradient


def error_of(api, func, mode, x=None):
    """The exception that calling `api(func, [x], tf.float32)` raises."""
    x = tf.constant([1.0]) if x is None else x

    def call(x):
        return api(func, [x], tf.float32)
    if mode == "graph":
        call = tf.function(call)
    try:
        call(x)
    except BaseException as exc:  # noqa: B036 (SystemExit is what is tested)
        return exc
    raise AssertionError("no error")
