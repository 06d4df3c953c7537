"""Issue 19's op-level acceptance tests for process workers, written against
the public API only (`executor=`, `pfb.stats()`), so that they hold whichever
route a pool call takes between the kernel and a worker (the proof that
dispatch needs no GIL in this process is tests/pool/test_pool_native_gil.py):

- every dtype, 0-d values, empty arrays, non-contiguous, broadcast and kept
  results, several outputs, eagerly, in tf.function and in a deterministic
  parallel map: the same values, dtypes and shapes, in order, as in-process;
- errors (an exception, a wrong dtype, a wrong static shape, a wrong number
  of outputs) with the in-process error's class and text;
- statistics count each pool call exactly once, per function and per pool.
"""
import re
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

POOL_NAME = "native acceptance pool"


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(2, name=POOL_NAME) as shared:
        yield shared


# ------------------------------------------------------------------ values --

DTYPES = [tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32,
          tf.uint64, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64,
          tf.complex128, tf.bool, tf.string]
# 0-d, empty, and ranks 1 to 3.
SHAPES = [(), (0,), (3, 0), (7,), (4, 5), (2, 3, 4)]
# 64 KiB or more for every dtype, so that an array the function allocates
# lands in the worker's shared result arena (README, "Data"), where a result
# kept by the function must still be copied.  Strings: 8 Ki object pointers.
BIG = (256, 256)
BIG_STRINGS = (64, 128)


def big(dtype):
    return BIG_STRINGS if dtype == tf.string else BIG


def values(dtype, shape, seed):
    """Random values of every bit pattern class the dtype has."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == tf.string:
        # Empty strings and NUL bytes inside; none at the end, which a 0-d
        # string (NumPy's `S` dtype, as `np.asarray(b"...")` makes it)
        # cannot hold.
        lengths = rng.integers(0, 7, n) * (rng.random(n) < 0.8)
        data = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
        ends = np.cumsum(lengths)
        data[ends[lengths > 0] - 1] |= 1
        flat = np.empty(n, dtype=object)
        flat[:] = [data[e - k:e].tobytes() for e, k in zip(ends.tolist(), lengths.tolist())]
    elif dtype == tf.bool:
        flat = rng.integers(0, 2, n).astype(bool)
    elif dtype.is_integer:
        np_dtype = dtype.as_numpy_dtype
        info = np.iinfo(np_dtype)
        flat = rng.integers(info.min, info.max, n, dtype=np_dtype, endpoint=True)
    else:
        np_dtype = dtype.as_numpy_dtype
        real = rng.standard_normal(n) * 1000
        if dtype.is_complex:
            flat = (real + 1j * rng.standard_normal(n) * 1000).astype(np_dtype)
        else:
            flat = real.astype(np_dtype)
        special = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(np_dtype)
        k = min(n, special.size)
        flat[:k] = special[:k]
    return flat.reshape(shape)


def constant(dtype, shape, seed):
    return tf.constant(values(dtype, shape, seed), dtype)


# --------------------------------------------------------------- functions --
# Module functions of a module that imports TensorFlow: they travel to the
# workers by value, with the globals they use (README, "Functions by value").

_KEPT = {}


def kept(a):
    """Writes `a` into an array this function keeps (one per dtype, shape
    and thread, allocated during a call) and returns that array: the next
    call overwrites it, so the bridge must copy it, never hand it over.
    Per thread because in-process, a parallel map's threads run the
    function at once, and Python may switch threads between the write and
    the return (a worker runs one call at a time, all in one thread)."""
    key = (a.dtype, a.shape, threading.get_ident())
    buffer = _KEPT.get(key)
    if buffer is None:
        buffer = _KEPT[key] = np.empty_like(a)
    buffer[...] = a
    return buffer


def views(a):
    """Seven results of `a`: fresh, strided views of the input and of a
    fresh array, transposes, a broadcast view and a kept array (for a 0-d
    input, a NumPy scalar where a rank-1 input gives a strided view)."""
    a = np.asarray(a)  # a graph's 0-d input is a NumPy scalar
    fresh = np.copy(a)
    return (fresh,
            a[::2] if a.ndim else a[()],
            fresh[::-1] if a.ndim else fresh,
            a.T,
            fresh.T,
            np.broadcast_to(a, (2,) + a.shape),
            kept(a))


N_VIEWS = 7


def views_as_list(a):
    return list(views(a))


def fresh_transposed(a):
    return np.copy(np.asarray(a)).T


# ----------------------------------------------------------- comparisons --

def as_numpy(value):
    value = value.numpy() if isinstance(value, tf.Tensor) else value
    if isinstance(value, bytes):  # a 0-d string tensor's .numpy(), or a[()] of one
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    return np.asarray(value)


def assert_identical(got, want, what):
    """Same dtype, shape and values, bit for bit (NaN payloads and -0.0
    included); strings as bytes, whichever NumPy form `want` has."""
    got, want = as_numpy(got), as_numpy(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.dtype == object or want.dtype.kind == "S":
        assert got.dtype == object, (what, got.dtype)
        assert got.tolist() == want.astype(object).tolist(), what
        return
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (
        what, got, want)


def assert_all_identical(got, want, what):
    assert isinstance(got, (list, tuple)) and len(got) == len(want), (what, got)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_identical(g, w, (what, k))


def inputs_for(dtype, seed):
    """One input per shape, and five of BIG: calls that write one kept
    array per worker thread.  With two workers (even were each to serve
    calls from two threads) some thread runs two of them, and a kept result
    handed over without a copy would change under the earlier one."""
    return ([constant(dtype, shape, seed + i) for i, shape in enumerate(SHAPES)]
            + [constant(dtype, big(dtype), seed + 100 + i) for i in range(5)])


# ---------------------------------------------------- correctness sweep --

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_eager_calls_match_in_process(pool, dtype):
    tout = [dtype] * N_VIEWS
    calls = []
    for x in inputs_for(dtype, seed=1):
        calls.append((x,
                      pfb.numpy_function(views, [x], tout, executor=pool),
                      pfb.numpy_function(views, [x], tout)))
    # Compared once every call has run, so a kept array shared with an
    # earlier result would show the later input here.
    for x, in_pool, in_process in calls:
        want = views(x.numpy())
        assert_all_identical(in_process, want, ("in-process", x.shape))
        assert_all_identical(in_pool, in_process, ("pool", x.shape))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_graph_calls_match_in_process(pool, dtype):
    tout = [dtype] * N_VIEWS
    inputs = inputs_for(dtype, seed=2)
    static_shapes = []

    @tf.function
    def run(xs):
        out = []
        for x in xs:
            pair = []
            for executor in (pool, None):
                results = pfb.numpy_function(views_as_list, [x], tout, executor=executor)
                spec = tf.TensorSpec(x.shape[::-1], dtype)  # a declared static shape
                transposed = pfb.numpy_function(fresh_transposed, [x], spec,
                                                executor=executor)
                static_shapes.append((tuple(transposed.shape), tuple(spec.shape)))
                pair.append(results + [transposed])
            out.append(pair)
        return out

    got = run(inputs)
    assert len(static_shapes) == 2 * len(inputs)
    for static, declared in static_shapes:
        assert static == declared
    for x, (in_pool, in_process) in zip(inputs, got):
        want = views(x.numpy()) + (fresh_transposed(x.numpy()),)
        assert_all_identical(in_process, want, ("in-process", x.shape))
        assert_all_identical(in_pool, in_process, ("pool", x.shape))


# The tables a tf.data pipeline reads its inputs from, row `i` for element
# `i`: 0-d, empty, rank 2 and BIG elements.
DATA_SHAPES = [(), (0,), (3, 0), (4, 5), "big"]
ELEMENTS = 8


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_a_deterministic_parallel_map_matches_in_process_in_order(pool, dtype):
    shapes = [big(dtype) if shape == "big" else shape for shape in DATA_SHAPES]
    tables = [values(dtype, (ELEMENTS,) + shape, 300 + k) for k, shape in enumerate(shapes)]
    tout = [dtype] * N_VIEWS

    def dataset(executor):
        constants = [tf.constant(table, dtype) for table in tables]

        def element(i):
            return tuple(tuple(pfb.numpy_function(views, [c[i]], tout, executor=executor))
                         for c in constants)
        return tf.data.Dataset.range(ELEMENTS).map(element, num_parallel_calls=4,
                                                   deterministic=True)

    # Every element is kept until the end: a kept array handed over without
    # a copy would show a later element's values in an earlier one.
    in_pool = list(dataset(pool))
    in_process = list(dataset(None))
    assert len(in_pool) == len(in_process) == ELEMENTS
    for i in range(ELEMENTS):
        for k, table in enumerate(tables):
            what = (i, shapes[k])
            assert_all_identical(in_process[i][k], views(table[i]), ("in-process",) + what)
            assert_all_identical(in_pool[i][k], in_process[i][k], ("pool",) + what)


# ------------------------------------------------------------------ errors --

def raises_value_error(a):
    raise ValueError(f"no use for {np.asarray(a).tolist()!r}")


def wrong_dtype(a):
    # Floats for ints: refused in every mode (eagerly a result of another
    # dtype converts only where no value changes).
    return np.asarray(a, np.float64) + 0.5


def two_results(a):
    return a, a


def one_result(a):
    return np.copy(a)


def float64_scalar(a):
    return np.float64(2.5)


def float_scalar_and_an_array(a):
    return np.copy(a), np.float64(0.5)


# (function, Tout, a phrase the in-process error's first line has)
ERROR_CASES = {
    "exception": (raises_value_error, tf.float32, "no use for [1.0, 2.0]"),
    "dtype": (wrong_dtype, tf.int32, "Tout declares int32"),
    # A NumPy scalar is named as one, though it travels as a 0-d block.
    "scalar dtype": (float64_scalar, tf.int32,
                     "returned np.float64(2.5), a NumPy scalar of dtype float64"),
    "scalar dtype among results": (float_scalar_and_an_array, [tf.float32, tf.int32],
                                   "output 1: Tout declares int32 but the function returned "
                                   "np.float64(0.5), a NumPy scalar of dtype float64"),
    "static shape": (one_result, tf.TensorSpec([3], tf.float32), "Tout declares shape (3,)"),
    "too many outputs": (two_results, tf.float32, "returned 2 value(s)"),
    "too few outputs": (one_result, [tf.float32, tf.float32], "returned 1 value(s)"),
}


def error_text(message):
    """The error itself, without what TensorFlow wraps it in: a graph's
    header and the stack where the node was built, the iterator's prefix,
    the node's note, and (after the first line) the traceback."""
    for line in message.splitlines():
        if (not line or line[0].isspace() or line == "Graph execution error:"
                or line.startswith("Detected at node")):
            continue
        return re.sub(r"^\{\{function_node .*?\}\} .*?Iterator::[\w:]+: ", "", line)
    raise AssertionError(f"no error text in {message!r}")


def error_of(func, tout, mode, executor):
    x = tf.constant([1.0, 2.0])

    def call(x):
        return pfb.numpy_function(func, [x], tout, executor=executor)
    try:
        if mode == "eager":
            call(x)
        elif mode == "graph":
            tf.function(call)(x)
        else:
            list(tf.data.Dataset.from_tensors(x).map(call, num_parallel_calls=2))
    except tf.errors.OpError as exc:
        return exc
    raise AssertionError(f"{mode} call of {func.__name__} raised nothing")


@pytest.mark.parametrize("mode", ["eager", "graph", "data"])
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_match_in_process(pool, case, mode):
    func, tout, phrase = ERROR_CASES[case]
    want = error_of(func, tout, mode, None)
    got = error_of(func, tout, mode, pool)
    text = error_text(want.message)
    assert phrase in text, want.message
    assert type(got) is type(want), (got, want)
    assert error_text(got.message) == text, got.message


def test_a_wrong_scalar_is_named_alike_under_xla(pool):
    """Under XLA too (a pool call from the custom call's handler), a NumPy
    scalar of the wrong dtype is named as in-process."""
    texts = []
    for executor in (None, pool):
        f = tf.function(lambda x: pfb.numpy_function(float64_scalar, [x],
                                                      tf.TensorSpec([], tf.int32),
                                                      executor=executor), jit_compile=True)
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            f(tf.constant([1.0, 2.0]))
        # (without TF's " [Op:__inference_<lambda>_N]", which names each function)
        texts.append(error_text(info.value.message).split(" [Op:")[0])
    assert "returned np.float64(2.5), a NumPy scalar of dtype float64" in texts[0], texts
    assert texts[1] == texts[0]


# -------------------------------------------------------------- statistics --

def double(a):
    return a * 2


def fails_on_negative(a):
    if np.any(a < 0):
        raise ValueError("a negative value")
    return a


def run_counted_calls(executor, name):
    """Eager, graph and tf.data calls of one function under `name`: 13 calls
    answered, one of them an error; returns the number of calls."""
    for v in range(3):
        pfb.numpy_function(fails_on_negative, [tf.constant([v])], tf.int32, name=name,
                           executor=executor)
    graph = tf.function(lambda x: pfb.numpy_function(fails_on_negative, [x], tf.int32,
                                                     name=name, executor=executor))
    graph(tf.constant([1]))
    graph(tf.constant([2]))
    dataset = tf.data.Dataset.range(7).map(
        lambda i: pfb.numpy_function(fails_on_negative, [tf.cast(i, tf.int32)], tf.int32,
                                     name=name, executor=executor),
        num_parallel_calls=4, deterministic=True)
    assert [int(v) for v in dataset] == list(range(7))
    with pytest.raises(tf.errors.InvalidArgumentError, match="a negative value"):
        graph(tf.constant([-1]))
    return 3 + 2 + 7 + 1


def test_statistics_count_each_pool_call_once(pool, stats_on):
    calls = run_counted_calls(pool, "counted_in_a_pool")
    snapshot = pfb.stats()
    in_pool = snapshot.functions["counted_in_a_pool"]
    assert (in_pool.calls, in_pool.errors) == (calls, 1)
    # The pool counts the calls its workers answered, the error included.
    assert snapshot.pools[POOL_NAME].calls == calls
    # The same calls in-process count alike, and not in the pool's record.
    assert run_counted_calls(None, "counted_in_process") == calls
    snapshot = pfb.stats()
    in_process = snapshot.functions["counted_in_process"]
    assert (in_process.calls, in_process.errors) == (in_pool.calls, in_pool.errors)
    assert snapshot.pools[POOL_NAME].calls == calls
    # And each further pool call adds exactly one, to both records.
    pfb.numpy_function(double, [tf.constant([4])], tf.int32, name="counted_in_a_pool",
                       executor=pool)
    snapshot = pfb.stats()
    assert snapshot.functions["counted_in_a_pool"].calls == calls + 1
    assert snapshot.pools[POOL_NAME].calls == calls + 1


# ------------------------------------------------- outputs handed back --

def plus_one(a):
    return a + 1


OUTPUTS_PER_CALL = 50


def fresh_arrays(a):
    """OUTPUTS_PER_CALL fresh arrays: each a block of the worker's result
    arena, which its output tensor holds until it is dropped."""
    return tuple(a + k for k in range(OUTPUTS_PER_CALL))


CALLS = 200
DROPPED = 10_000


def test_dropping_many_outputs_leaves_the_next_calls_as_fast():
    """Each output of a native call hands its block back to its worker when
    it is dropped, with that worker's next request.  10,000 of them once
    filled a sleeping worker's request ring without waking it: each call
    behind them waited out its second's deadline for room, then took the
    Python path, and the calls after the drop took seconds instead of a
    tenth of one.  Graph calls one after the other: each has a route already
    and finds its worker asleep (a new tf.data map's first calls take the
    Python path, whose hand-backs ring the worker, so they hid the stall
    now and then).  The baseline is the slowest of three rounds, so that a
    loaded machine slows it as much as the round it is compared with."""
    with pfb.ProcessPool(2, name="hand-back pool") as pool:
        many = tf.function(lambda x: pfb.numpy_function(
            fresh_arrays, [x], [tf.int64] * OUTPUTS_PER_CALL, executor=pool))
        one = tf.function(lambda x: pfb.numpy_function(plus_one, [x], tf.int64,
                                                       executor=pool))
        x = tf.range(4, dtype=tf.int64)

        def round_of_calls():
            start = time.monotonic()
            for _ in range(CALLS):
                one(x)
            return time.monotonic() - start

        round_of_calls()  # the route and a worker that has the function
        before = max(round_of_calls() for _ in range(3))
        kept = [many(x) for _ in range(DROPPED // OUTPUTS_PER_CALL)]
        assert [int(v[1]) for v in kept[-1][:3]] == [1, 2, 3]
        del kept  # every block goes back to its worker
        after = round_of_calls()
        np.testing.assert_array_equal(one(x).numpy(), [1, 2, 3, 4])
    # The stall cost a second per call; a loaded machine, tens of milliseconds.
    assert after <= 2 * before + 0.5, (
        f"{CALLS} calls took {after:.2f} s after {DROPPED} outputs were dropped, "
        f"against {before:.2f} s before")
