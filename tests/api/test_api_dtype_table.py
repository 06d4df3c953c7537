"""The project's one dtype table (src/dtype_table.h), through the public API:
every dtype it names crosses the bridge alike in-process, in a worker
process and under XLA (the kernel's, the conversion layer's, the pool
records' and XLA's lookups are all generated from its rows), and Tout takes
exactly those dtypes.  The list below is the oracle, written out by hand.
(Values over every bit pattern, shapes and views: tests/pool/test_pool_native.py;
XLA against TF's own ops: tests/xla/test_xla.py.)"""
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb

NUMERIC = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int8, tf.int16, tf.int32,
           tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.complex64,
           tf.complex128]


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(1, name="dtype table pool") as shared:
        yield shared


def sample(dtype):
    if dtype == tf.string:
        return tf.constant([[b"a", b""], [b"b\0c", b"de"]])
    if dtype == tf.bool:
        return tf.constant([[True, False, False], [True, True, False]])
    x = tf.reshape(tf.range(-3, 3), (2, 3))
    if dtype.is_complex:
        return tf.cast(x, dtype) * tf.constant(1 - 2j, dtype)
    return tf.cast(x, dtype)  # (the unsigned ones wrap: their largest values)


def flip(a):
    """A fresh array (its rows reversed) and the first item, as a NumPy scalar."""
    return np.ascontiguousarray(a[::-1]), a.reshape(-1)[0]


def results(dtype, executor, how):
    x = sample(dtype)
    tout = [tf.TensorSpec(x.shape, dtype), tf.TensorSpec([], dtype)]  # (XLA needs shapes)
    call = lambda x: pfb.numpy_function(flip, [x], tout, executor=executor)  # noqa: E731
    if how == "graph":
        call = tf.function(call)
    elif how == "xla":
        call = tf.function(call, jit_compile=True)
    return call(x)


@pytest.mark.parametrize("how", ["eager", "graph", "xla"])
@pytest.mark.parametrize("dtype", NUMERIC + [tf.string], ids=lambda d: d.name)
def test_every_dtype_round_trips_alike_in_process_pooled_and_under_xla(pool, dtype, how):
    if how == "xla" and dtype == tf.string:
        pytest.skip("XLA has no strings")
    x = sample(dtype).numpy()
    want = flip(x)
    for executor in (None, pool):
        got = results(dtype, executor, how)
        for out, expected in zip(got, want):
            assert out.dtype == dtype, (executor, how)
            assert out.shape == np.shape(expected), (executor, how)
            np.testing.assert_array_equal(out.numpy(), expected)
            if dtype != tf.string:  # (a 0-d string is bytes)
                assert out.numpy().dtype == expected.dtype


def test_tout_takes_exactly_the_table():
    """A dtype outside the table is refused, naming the supported ones: the
    table's names, strings added."""
    with pytest.raises(TypeError, match="does not support dtype qint8") as info:
        pfb.numpy_function(flip, [tf.constant(1)], tf.qint8)
    named = set(str(info.value).split("supported dtypes are ")[1].split(", "))
    assert named == {d.name for d in NUMERIC} | {"string"}
