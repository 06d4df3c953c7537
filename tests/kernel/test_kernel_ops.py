"""The kernel through its ops: zero-copy in and out, the copy policy, aliasing
safety, dtypes, strings, and the eager direct call against the op (lifetimes:
test_kernel_lifetimes.py)."""
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import address, collect


def run(func, inputs, Tout, **kwargs):
    return pfb.numpy_function(func, inputs, Tout, **kwargs)


class Recorder:
    """A function that records the addresses of what it saw and returned."""

    def __init__(self, body):
        self.body = body
        self.inputs = []
        self.output = None
        self.writable = []

    def __call__(self, *arrays):
        self.inputs = [address(a) for a in arrays]
        self.writable = [a.flags.writeable for a in arrays]
        out = self.body(*arrays)
        self.output = address(out)
        return out


# ------------------------------------------------------------- zero-copy --

def test_copy_false_inputs_are_zero_copy_read_only_views():
    x = tf.constant(np.arange(1024, dtype=np.float32))
    rec = Recorder(lambda a: a.sum(keepdims=True))
    run(rec, [x], tf.float32, copy=False)
    assert rec.inputs == [address(x)]
    assert rec.writable == [False]


def test_inputs_tf_shares_are_writable_private_copies():
    """An eager tensor Python holds is shared: the input policy copies it."""
    x = tf.constant(np.arange(1024, dtype=np.float32))
    rec = Recorder(lambda a: a.sum(keepdims=True))
    run(rec, [x], tf.float32)
    assert rec.inputs != [address(x)]
    assert rec.writable == [True]


def test_fresh_output_is_zero_copy():
    x = tf.constant(np.arange(1024, dtype=np.float32))
    rec = Recorder(lambda a: a * 2)
    y = run(rec, [x], tf.float32)
    assert address(y) == rec.output
    np.testing.assert_array_equal(y.numpy(), np.arange(1024) * 2)


@pytest.mark.parametrize("size", [1, 3, 17, 100, 1000, 4097, 65537])
def test_fresh_outputs_are_aligned_and_zero_copy_for_any_size(size):
    x = tf.constant(np.arange(size, dtype=np.uint8))
    rec = Recorder(lambda a: a + 1)
    y = run(rec, [x], tf.uint8)
    assert rec.output % 64 == 0
    assert address(y) == rec.output


def test_private_view_chain_of_fresh_array_is_zero_copy():
    x = tf.constant(np.arange(16, dtype=np.float32))
    rec = Recorder(lambda a: (a * 2).reshape(4, 4))
    y = run(rec, [x], tf.float32)
    assert address(y) == rec.output
    assert y.shape == (4, 4)


def test_output_that_views_an_input_shares_tf_memory():
    x = tf.constant(np.arange(16, dtype=np.float32))
    y = run(lambda a: a.reshape(4, 4), [x], tf.float32, copy=False)
    assert address(y) == address(x)
    del x
    collect()
    np.testing.assert_array_equal(y.numpy().ravel(), np.arange(16))


def test_writing_to_an_input_under_copy_false_is_an_error_that_mentions_copy_none():
    def write(a):
        a[0] = 1
        return a

    with pytest.raises(tf.errors.InvalidArgumentError, match="copy=None"):
        run(write, [tf.constant([0.0, 0.0])], tf.float32, copy=False)


def test_input_views_cannot_be_made_writable():
    def unlock(a):
        a.setflags(write=True)
        return a

    with pytest.raises(tf.errors.InvalidArgumentError, match="WRITEABLE"):
        run(unlock, [tf.constant([0.0, 0.0])], tf.float32, copy=False)


def test_writing_to_an_input_under_the_default_changes_no_tensor():
    x = tf.constant([0.0, 0.0])

    def write(a):
        a[0] = 1
        return a

    np.testing.assert_array_equal(run(write, [x], tf.float32).numpy(), [1, 0])
    np.testing.assert_array_equal(x.numpy(), [0, 0])


def test_copy_true_gives_private_writable_inputs_and_copied_outputs():
    x = tf.constant(np.arange(8, dtype=np.float32))
    seen = {}

    def func(a):
        seen["writable"] = a.flags.writeable
        seen["in"] = address(a)
        a += 1  # private: must not change x
        out = a * 2
        seen["out"] = address(out)
        return out

    y = pfb.numpy_function(func, [x], tf.float32, copy=True)
    assert seen["writable"] is True
    assert seen["in"] != address(x)
    assert address(y) != seen["out"]
    np.testing.assert_array_equal(x.numpy(), np.arange(8))
    np.testing.assert_array_equal(y.numpy(), (np.arange(8) + 1) * 2)


def test_copy_false_fresh_output_is_zero_copy():
    x = tf.constant(np.arange(8, dtype=np.float32))
    rec = Recorder(lambda a: a * 3)
    y = pfb.numpy_function(rec, [x], tf.float32, copy=False)
    assert address(y) == rec.output
    assert rec.inputs == [address(x)]


GLOBAL = np.zeros(4, np.float32)


def test_returning_a_global_copies_and_later_mutation_does_not_leak_in():
    GLOBAL[:] = 1
    before = sys.getrefcount(GLOBAL)
    y = run(lambda: GLOBAL, [], tf.float32)
    assert not np.shares_memory(np.asarray(y), GLOBAL)
    GLOBAL[:] = 7
    np.testing.assert_array_equal(y.numpy(), [1, 1, 1, 1])
    collect()
    assert sys.getrefcount(GLOBAL) == before


def test_returning_a_view_of_a_global_copies():
    base = np.arange(8, dtype=np.float32)
    y = run(lambda: base[:4], [], tf.float32)
    base[:] = -1
    np.testing.assert_array_equal(y.numpy(), [0, 1, 2, 3])


def test_returning_a_closure_array_after_the_call_mutates_it():
    state = {"a": np.zeros(3, np.int64)}

    def func():
        return state["a"]

    y = run(func, [], tf.int64)
    state["a"][:] = 5
    np.testing.assert_array_equal(y.numpy(), [0, 0, 0])


def test_strided_output_is_copied_once_and_correct():
    x = tf.constant(np.arange(16, dtype=np.float64))
    rec = Recorder(lambda a: (a * 2)[::2])
    y = run(rec, [x], tf.float64)
    assert address(y) != rec.output
    np.testing.assert_array_equal(y.numpy(), np.arange(0, 32, 4))


def test_transposed_output_is_copied_in_row_major_order():
    y = run(lambda: np.arange(6).reshape(2, 3).T.copy().T.T, [], tf.int64)
    np.testing.assert_array_equal(y.numpy(), np.arange(6).reshape(2, 3).T)


def test_copy_false_rejects_strided_output_and_says_why():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="not C-contiguous.*copy=False"):
        pfb.numpy_function(lambda: np.arange(8.0)[::2], [], tf.float64, copy=False)


def test_copy_false_rejects_global_output_and_says_why():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0 would need a copy.*still reachable"):
        pfb.numpy_function(lambda: GLOBAL, [], tf.float32, copy=False)


def test_unaligned_output_is_copied_and_copy_false_says_why():
    def unaligned():
        return np.arange(65, dtype=np.uint8)[1:]  # private, but 1 byte off

    y = run(unaligned, [], tf.uint8)
    assert address(y) % 64 == 0
    np.testing.assert_array_equal(y.numpy(), np.arange(1, 65))
    with pytest.raises(tf.errors.InvalidArgumentError, match="64-byte aligned"):
        pfb.numpy_function(unaligned, [], tf.uint8, copy=False)


def test_copy_false_converts_strings_without_error():
    y = pfb.numpy_function(lambda: np.array(["a", "b"]), [], tf.string, copy=False)
    assert y.numpy().tolist() == [b"a", b"b"]


# ----------------------------------------------------------------- dtypes --

NUMERIC = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16,
           np.int8, np.int16, np.int32, np.int64,
           np.uint8, np.uint16, np.uint32, np.uint64,
           np.complex64, np.complex128, np.bool_]


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_every_numeric_dtype_round_trips_zero_copy(dtype):
    values = np.array([0, 1, 1, 0, 1], dtype=dtype)
    if np.dtype(dtype).kind in "iu":
        values[-1] = np.iinfo(dtype).max
    x = tf.constant(values)
    rec = Recorder(lambda a: a.copy())
    y = run(rec, [x], x.dtype, copy=False)
    assert rec.inputs == [address(x)]
    assert address(y) == rec.output
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.numpy(), values)


@pytest.mark.parametrize("value,tout,expected", [
    (3, tf.int32, 3),
    (3, tf.float32, 3.0),
    (True, tf.bool, True),
    (True, tf.float64, 1.0),
    (2.5, tf.float64, 2.5),
    (1 + 2j, tf.complex64, 1 + 2j),
    ([1, 2, 3], tf.uint8, [1, 2, 3]),
    ([[1.5, 2], [3, 4]], tf.float16, [[1.5, 2], [3, 4]]),
])
def test_python_values_convert_to_the_declared_dtype(value, tout, expected):
    y = run(lambda: (value,), [], [tout])  # eagerly: a tensor, as TF's
    assert y.dtype == tout
    np.testing.assert_array_equal(y.numpy(), np.asarray(expected, tout.as_numpy_dtype))


def test_python_int_out_of_range_is_an_error():
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of bounds"):
        run(lambda: 2 ** 40, [], tf.int32)


def test_numpy_scalar_of_the_declared_dtype_is_accepted():
    y = run(lambda a: a.sum(), [tf.constant([1.5, 2.0], tf.float32)], tf.float32)
    assert y.numpy() == 3.5


def test_numpy_scalar_of_another_dtype_is_an_error():
    # (a float for an int: eagerly a dtype converts only where no value changes)
    with pytest.raises(tf.errors.InvalidArgumentError, match="float64"):
        run(lambda: np.float64(1.5), [], tf.int32)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 1)])
def test_empty_tensors_in_and_out(shape):
    x = tf.zeros(shape, tf.float32)
    y = run(lambda a: a + 1, [x], tf.float32)
    assert y.shape == shape


def test_scalars_in_and_out():
    y = run(lambda a: a * 2, [tf.constant(21, tf.int64)], tf.int64)
    assert y.shape == () and y.numpy() == 42


# ---------------------------------------------------------------- strings --

def test_string_inputs_arrive_as_object_arrays_of_bytes_with_nuls_kept():
    seen = {}

    def func(a):
        seen["dtype"] = a.dtype
        seen["items"] = a.tolist()
        return a

    y = run(func, [tf.constant([[b"a\x00b", b""], [b"\xff", b"xyz"]])], tf.string)
    assert seen["dtype"] == object
    assert seen["items"] == [[b"a\x00b", b""], [b"\xff", b"xyz"]]
    assert y.numpy().tolist() == [[b"a\x00b", b""], [b"\xff", b"xyz"]]


@pytest.mark.parametrize("value,expected", [
    (b"raw\x00bytes", b"raw\x00bytes"),
    ("h\u00e9llo", "h\u00e9llo".encode()),
    (np.array(["\u00fc", "ab"]), [b"\xc3\xbc", b"ab"]),
    (np.array([b"ab", b"c"]), [b"ab", b"c"]),
    (np.array([b"x\x00y", "z"], dtype=object), [b"x\x00y", b"z"]),
    (np.str_("s"), b"s"),
])
def test_string_outputs(value, expected):
    y = run(lambda: value, [], tf.string)
    out = y.numpy()
    assert (out.tolist() if isinstance(out, np.ndarray) else out) == expected


def test_string_list_output_in_a_multi_output_result():
    s, n = run(lambda: ([b"a", "b"], 1), [], [tf.string, tf.int32])
    assert s.numpy().tolist() == [b"a", b"b"] and n.numpy() == 1


def test_string_output_with_a_bad_element_names_it():
    # TF's class: an item with no tensor form is INTERNAL ("Unsupported object type int").
    with pytest.raises(tf.errors.InternalError, match="element 1.*int"):
        run(lambda: np.array([b"a", 3], dtype=object), [], tf.string)


def test_numeric_array_for_string_output_is_an_error():
    with pytest.raises(tf.errors.InvalidArgumentError, match="string"):
        run(lambda: np.zeros(2), [], tf.string)


# ------------------------------------------- eager: direct call vs the op --

@pytest.fixture(params=["direct", "dispatched"])
def eager_path(request, monkeypatch):
    """Eager calls skip TF's op dispatch where TF has one CPU device; the
    dispatched op (GPU machines, async mode) must behave the same."""
    conv = pfb._library.conversion()
    one_cpu = [d.device_type for d in tf.config.list_logical_devices()] == ["CPU"]
    assert conv.direct_eager_calls() == one_cpu
    if request.param == "direct" and not one_cpu:
        pytest.skip("TF has devices beyond one CPU here: eager calls dispatch the op")
    if request.param == "dispatched":
        monkeypatch.setattr(conv, "direct_eager_calls", lambda: False)
    return request.param


def test_eager_paths_agree_on_results_and_zero_copy(eager_path):
    made = {}

    def body(a, s):
        out = a * 2
        made["address"] = address(out)
        return out, s

    x = tf.constant(np.arange(64, dtype=np.float32))
    y, s = pfb.numpy_function(body, [x, tf.constant([b"a\0b"])], [tf.float32, tf.string])
    np.testing.assert_array_equal(y, np.arange(64) * 2)
    assert address(y) == made["address"]
    assert s.numpy().tolist() == [b"a\0b"]


def test_eager_paths_agree_on_errors(eager_path):
    x = tf.constant([1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output 0: Tout declares int32"):
        pfb.numpy_function(lambda a: a, [x], tf.int32)
    with pytest.raises(tf.errors.OutOfRangeError, match="StopIteration"):
        pfb.numpy_function(lambda a: next(iter(())), [x], tf.float32)


def test_eager_paths_agree_on_no_outputs(eager_path):
    seen = []
    # None, as TF's eager numpy_function (issue 9).
    assert pfb.numpy_function(lambda a: seen.append(1), [tf.constant(1)], []) is None
    assert seen == [1]
    # Stateless too: a dispatched op without outputs must not be pruned.
    assert pfb.numpy_function(lambda a: seen.append(2), [tf.constant(1)], [],
                              stateful=False) is None
    assert pfb.py_func(lambda a: seen.append(3), [tf.constant(1)], [],
                       stateful=False) is None
    assert seen == [1, 2, 3]


def test_eager_paths_agree_on_scalar_inputs(eager_path):
    """Eagerly a 0-d input is a 0-d array on both paths, as TF's eager
    numpy_function hands it over (graphs: a NumPy scalar, test_api_parity)."""
    seen = []

    def body(a, s):
        seen.append((type(a), a.dtype, a.shape, type(s), s.shape, s[()]))
        return a, s

    a, s = pfb.numpy_function(body, [tf.constant(1.5), tf.constant("abc")],
                              [tf.float32, tf.string])
    assert seen == [(np.ndarray, np.float32, (), np.ndarray, (), b"abc")]
    assert float(a) == 1.5 and s.numpy() == b"abc"


def test_eager_paths_agree_on_unsupported_results(eager_path):
    """A result without a tensor form: InternalError (TF's class in graphs)
    and ValueError (its eager class), on both paths."""
    structured = np.zeros(2, dtype=[("a", "f4"), ("b", "i4")])
    with pytest.raises(tf.errors.InternalError, match="Unsupported numpy data type") as info:
        pfb.numpy_function(lambda a: structured, [tf.constant([1.0])], tf.float32)
    assert isinstance(info.value, ValueError)
