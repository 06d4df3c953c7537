"""The DLPack conversion API of the conversion layer: from_dlpack, to_dlpack,
to_numpy, from_numpy.  Zero-copy by addresses, copies by their negation,
lifetimes by deleter counts around del + gc.collect(), and a ctypes producer
for every malformed tensor the import rejects."""
import ctypes
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import dlpack_ctypes as dl
from conftest import address, collect

conv = pfb._library.conversion()
KINDS = pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
# TensorFlow with a GPU accepts CUDA memory: a fake CUDA tensor would reach it.
CPU_ONLY_TF = pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                                 reason="TensorFlow has a GPU: CUDA memory is accepted")


def aligned(values, dtype=np.float32):
    with conv.aligned_allocation():
        return np.array(values, dtype=dtype)


# ----------------------------------------------------------------- from_dlpack

@KINDS
def test_from_dlpack_capsule_is_zero_copy_and_frees_once(versioned):
    producer = dl.Producer()
    a = aligned(np.arange(12).reshape(3, 4))
    capsule = producer.capsule(a, versioned=versioned)
    t = pfb.from_dlpack(capsule)
    assert dl.capsule_name(capsule) == ("used_dltensor_versioned" if versioned
                                        else "used_dltensor")
    assert address(t) == a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a)
    del capsule
    collect()
    assert producer.deleted == 0  # the tensor still reads the memory
    del t
    collect()
    assert producer.deleted == 1


@KINDS
def test_consumed_capsule_is_rejected(versioned):
    producer = dl.Producer()
    capsule = producer.capsule(aligned([1, 2]), versioned=versioned)
    pfb.from_dlpack(capsule)
    with pytest.raises(BufferError, match="already consumed"):
        pfb.from_dlpack(capsule)


@pytest.mark.parametrize("copy", [None, True])
@KINDS
def test_unaligned_or_strided_memory_is_copied_once(versioned, copy):
    producer = dl.Producer()
    base = aligned(np.arange(20))
    unaligned = producer.capsule(base[1:], versioned=versioned)   # 4 bytes past 64
    strided = producer.capsule(base, versioned=versioned, shape=[10], strides=[2])
    t1, t2 = pfb.from_dlpack(unaligned, copy=copy), pfb.from_dlpack(strided, copy=copy)
    np.testing.assert_array_equal(t1.numpy(), base[1:])
    np.testing.assert_array_equal(t2.numpy(), base[::2])
    for t in (t1, t2):
        assert not np.shares_memory(pfb.to_numpy(t), base)
        assert address(t) % 64 == 0
    collect()
    assert producer.deleted == 2  # the copies do not hold the producer's memory


@pytest.mark.parametrize("kwargs,words", [
    (dict(shape=[10], strides=[2]), "not C-contiguous"),
    (dict(byte_offset=4, shape=[19]), "not 64-byte aligned"),
])
def test_copy_false_says_why(kwargs, words):
    producer = dl.Producer()
    capsule = producer.capsule(aligned(np.arange(20)), **kwargs)
    with pytest.raises(BufferError, match=words):
        pfb.from_dlpack(capsule, copy=False)
    del capsule
    collect()
    assert producer.deleted == 1


def test_copy_true_never_shares():
    a = aligned(np.arange(8))
    t = pfb.from_dlpack(a, copy=True)
    assert not np.shares_memory(pfb.to_numpy(t), a)
    np.testing.assert_array_equal(t.numpy(), a)


def test_size_one_dimensions_may_have_any_stride():
    producer = dl.Producer()
    a = aligned(np.arange(4))
    t = pfb.from_dlpack(producer.capsule(a, shape=[1, 4], strides=[99, 1]), copy=False)
    assert address(t) == a.ctypes.data and t.shape == (1, 4)


def test_empty_tensor_with_null_data():
    producer = dl.Producer()
    t = pfb.from_dlpack(producer.capsule(aligned([]), shape=[0, 3], null_data=True))
    assert t.shape == (0, 3) and t.dtype == tf.float32


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.int16,
                                   np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64, np.complex64, np.complex128, np.bool_])
def test_numpy_dtypes_round_trip_zero_copy(dtype):
    a = aligned(np.arange(6) % 2 if dtype is np.bool_ else np.arange(6), dtype)
    t = pfb.from_dlpack(a)
    assert t.dtype == tf.as_dtype(dtype)
    assert address(t) == a.ctypes.data
    back = pfb.to_numpy(t)
    assert back.dtype == a.dtype and np.shares_memory(back, a)


def test_producer_without_dlpack_1_keywords_gets_the_legacy_call():
    producer = dl.Producer()
    exporter = dl.Exporter(producer.capsule(aligned([1, 2]), versioned=False),
                           legacy_only=True)
    t = pfb.from_dlpack(exporter)
    assert exporter.calls == [{}]
    np.testing.assert_array_equal(t.numpy(), [1, 2])


def test_producer_is_asked_for_a_versioned_capsule_without_stream_on_cpu():
    producer = dl.Producer()
    exporter = dl.Exporter(producer.capsule(aligned([1, 2])))
    pfb.from_dlpack(exporter)
    assert exporter.calls == [{"max_version": (1, 1)}]


@CPU_ONLY_TF
def test_cuda_producer_is_rejected_before_it_exports():
    exporter = dl.Exporter(None, device=(dl.kDLCUDA, 0))
    with pytest.raises(BufferError, match="device cuda:0"):
        pfb.from_dlpack(exporter)
    assert exporter.calls == []


def test_not_a_producer():
    with pytest.raises(TypeError, match="no __dlpack__"):
        pfb.from_dlpack([1, 2])


def test_foreign_capsule_name():
    capsule = conv._bridge_api  # a capsule, but not DLPack's
    with pytest.raises(BufferError, match="not a DLPack capsule"):
        pfb.from_dlpack(capsule)


@pytest.mark.parametrize("copy", ["yes", 0, 1])
def test_copy_takes_only_none_true_false(copy):
    for api, arg in ((pfb.from_dlpack, aligned([1])), (pfb.from_numpy, aligned([1])),
                     (pfb.to_numpy, tf.constant(1)), (pfb.to_dlpack, tf.constant(1))):
        with pytest.raises(ValueError, match="copy must be None, True or False"):
            api(arg, copy=copy)


# ------------------------------------------------- malformed capsules (ctypes)

MALFORMED = [
    (dict(ndim=-1), "ndim -1"),
    (dict(ndim=65, shape=[1] * 65), "ndim 65"),
    (dict(null_shape=True), "NULL shape"),
    (dict(shape=[2, -3]), "negative dimension -3"),
    (dict(shape=[2 ** 40, 2 ** 40]), "too large"),
    (dict(null_data=True), "NULL data"),
    (dict(dtype=dl.DLDataType(dl.kDLFloat, 8, 1)), "unsupported DLPack dtype"),
    (dict(dtype=dl.DLDataType(dl.kDLInt, 7, 1)), "unsupported DLPack dtype"),
    (dict(dtype=dl.DLDataType(dl.kDLFloat, 32, 4)), "4 lanes"),
    (dict(dtype=dl.DLDataType(99, 32, 1)), "unsupported DLPack dtype"),
    (dict(dtype=dl.DLDataType(dl.kDLOpaqueHandle, 64, 1)), "opaque handle"),
    (dict(dtype=dl.DLDataType(dl.kDLBool, 16, 1)), "unsupported DLPack dtype"),
    pytest.param(dict(device=(dl.kDLCUDA, 0)), "device cuda:0", marks=CPU_ONLY_TF),
    (dict(device=(13, 1)), "device cuda_managed:1"),
    (dict(device=(99, 0)), "device type 99:0"),
]


@pytest.mark.parametrize("kwargs,words", MALFORMED,
                         ids=[(m.values if hasattr(m, "values") else m)[1] for m in MALFORMED])
@KINDS
def test_malformed_capsule_is_rejected_and_left_to_its_producer(versioned, kwargs, words):
    producer = dl.Producer()
    capsule = producer.capsule(aligned(np.arange(4)), versioned=versioned, **kwargs)
    with pytest.raises(BufferError, match=words):
        pfb.from_dlpack(capsule)
    assert dl.capsule_name(capsule) in ("dltensor", "dltensor_versioned")  # not consumed
    assert producer.deleted == 0
    del capsule
    collect()
    assert producer.deleted == 1  # its own destructor freed it, once


@pytest.mark.parametrize("version", [(0, 8), (2, 0)])
def test_unknown_major_version_is_rejected(version):
    producer = dl.Producer()
    capsule = producer.capsule(aligned([1, 2]), version=version)
    with pytest.raises(BufferError, match=f"major version {version[0]}.{version[1]}"):
        pfb.from_dlpack(capsule)
    del capsule
    collect()
    assert producer.deleted == 1


def test_newer_minor_version_is_accepted():
    producer = dl.Producer()
    t = pfb.from_dlpack(producer.capsule(aligned([1, 2]), version=(1, 7)))
    np.testing.assert_array_equal(t.numpy(), [1, 2])


# -------------------------------------------------------------- to_dlpack

def test_to_dlpack_versioned_is_read_only_zero_copy_and_frees_tf_memory():
    t = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    exporter = pfb.to_dlpack(t)
    assert exporter.__dlpack_device__() == (dl.kDLCPU, 0)
    capsule = exporter.__dlpack__(max_version=(1, 0))
    assert dl.capsule_name(capsule) == "dltensor_versioned"
    managed, tensor = dl.capsule_tensor(capsule)
    assert managed.flags & dl.READ_ONLY and not managed.flags & dl.IS_COPIED
    assert (managed.version.major, tensor.ndim) == (1, 2)
    assert tensor.data == address(t)
    a = np.from_dlpack(dl.Exporter(capsule))
    assert not a.flags.writeable and np.shares_memory(a, pfb.to_numpy(t))


def test_to_dlpack_legacy_for_old_consumers():
    t = tf.constant([1.0, 2.0])
    capsule = pfb.to_dlpack(t).__dlpack__()
    assert dl.capsule_name(capsule) == "dltensor"
    _, tensor = dl.capsule_tensor(capsule)
    assert tensor.data == address(t)
    u = tf.experimental.dlpack.from_dlpack(capsule)  # TF itself reads it
    assert address(u) == address(t)


@KINDS
def test_to_dlpack_bool_is_kdlbool(versioned):
    capsule = pfb.to_dlpack(tf.constant([True, False])).__dlpack__(
        max_version=(1, 0) if versioned else None)
    _, tensor = dl.capsule_tensor(capsule)
    assert (tensor.dtype.code, tensor.dtype.bits) == (dl.kDLBool, 8)


def test_to_dlpack_copy_is_private_and_flagged():
    t = tf.constant([1, 2, 3])
    capsule = pfb.to_dlpack(t, copy=True).__dlpack__(max_version=(1, 1))
    managed, tensor = dl.capsule_tensor(capsule)
    assert managed.flags & dl.IS_COPIED and not managed.flags & dl.READ_ONLY
    a = np.from_dlpack(dl.Exporter(capsule))
    assert a.flags.writeable and not np.shares_memory(a, pfb.to_numpy(t))


def test_exporter_copy_keyword_copies_without_consuming():
    t = tf.constant([1.0, 2.0])
    exporter = pfb.to_dlpack(t)
    copied = np.from_dlpack(exporter, copy=True)
    assert copied.flags.writeable and not np.shares_memory(copied, pfb.to_numpy(t))
    shared = np.from_dlpack(exporter)
    assert np.shares_memory(shared, pfb.to_numpy(t))


def test_exporter_is_consumed_once():
    exporter = pfb.to_dlpack(tf.constant([1.0]))
    np.from_dlpack(exporter)
    with pytest.raises(BufferError, match="already exported"):
        exporter.__dlpack__()
    with pytest.raises(BufferError, match="already exported"):
        exporter.__dlpack_device__()


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(stream=5), BufferError, "CPU exports take stream=None"),
    (dict(dl_device=(dl.kDLCUDA, 0)), BufferError, "cannot export to device"),
    (dict(copy="no"), ValueError, "copy must be"),
    (dict(max_version="1.0"), TypeError, "max_version"),
])
def test_exporter_rejects_bad_keywords(kwargs, error, words):
    exporter = pfb.to_dlpack(tf.constant([1.0]))
    with pytest.raises(error, match=words):
        exporter.__dlpack__(**kwargs)
    np.from_dlpack(exporter)  # still usable


def test_exporter_accepts_stream_minus_one_and_own_device():
    t = tf.constant([1.0])
    capsule = pfb.to_dlpack(t).__dlpack__(stream=-1, dl_device=(dl.kDLCPU, 0),
                                          max_version=(1, 0), copy=False)
    assert dl.capsule_name(capsule) == "dltensor_versioned"


@KINDS
def test_unconsumed_export_releases_tf_memory(versioned):
    t = tf.constant(np.zeros(1000, np.float32))
    before = sys.getrefcount(t)
    capsule = pfb.to_dlpack(t).__dlpack__(max_version=(1, 0) if versioned else None)
    del capsule
    collect()
    assert sys.getrefcount(t) == before
    exporter = pfb.to_dlpack(t)
    del exporter
    collect()
    assert sys.getrefcount(t) == before


def test_to_dlpack_rejects_symbolic_and_string_tensors():
    with pytest.raises(TypeError, match="symbolic"):
        tf.function(lambda x: pfb.to_dlpack(x))(tf.constant(1.0))
    with pytest.raises(TypeError, match="no DLPack form"):
        pfb.to_dlpack(tf.constant(b"s"))
    with pytest.raises(TypeError, match="eager tf.Tensor"):
        pfb.to_dlpack(np.zeros(2))


def test_tf_tensor_is_a_producer_for_from_dlpack():
    t = tf.constant([True, False, True])
    u = pfb.from_dlpack(t)
    assert u.dtype == tf.bool and address(u) == address(t)


# ------------------------------------------------------ to_numpy / from_numpy

def test_to_numpy_is_a_read_only_view_that_cannot_be_made_writable():
    t = tf.constant(np.arange(4.0))
    v = pfb.to_numpy(t)
    assert address(v) == address(t) and not v.flags.writeable
    with pytest.raises(ValueError):
        v.flags.writeable = True
    with pytest.raises(ValueError, match="read-only"):
        v[0] = 1


def test_to_numpy_copy():
    t = tf.constant(np.arange(4.0))
    c = pfb.to_numpy(t, copy=True)
    assert c.flags.writeable and not np.shares_memory(c, pfb.to_numpy(t))
    assert address(pfb.to_numpy(t, copy=False)) == address(t)


@pytest.mark.parametrize("dtype", [tf.bool, tf.bfloat16, tf.float16, tf.complex128,
                                   tf.uint64])
def test_to_numpy_dtypes(dtype):
    t = tf.cast(tf.constant([0, 1, 1]), dtype)
    v = pfb.to_numpy(t)
    assert v.dtype == dtype.as_numpy_dtype
    np.testing.assert_array_equal(v, t.numpy())


def test_to_numpy_strings_are_converted():
    v = pfb.to_numpy(tf.constant([b"a", b"b\x00c"]))
    assert v.dtype == object and list(v) == [b"a", b"b\x00c"]


def test_view_keeps_tf_memory_alive():
    v = pfb.to_numpy(tf.constant(np.arange(1000.0)))
    collect()
    np.testing.assert_array_equal(v, np.arange(1000.0))


def test_from_numpy_round_trip_of_a_read_only_view_is_zero_copy():
    t = tf.constant(np.arange(16.0).reshape(2, 8))
    u = pfb.from_numpy(pfb.to_numpy(t))
    assert address(u) == address(t)
    assert address(pfb.from_numpy(pfb.to_numpy(t)[1])) == address(t) + 64  # a row
    assert address(pfb.from_numpy(pfb.to_numpy(t)[0, 1:])) != address(t) + 8  # unaligned


def test_from_numpy_copies_writable_memory_unless_copy_false():
    a = aligned(np.arange(8))
    t = pfb.from_numpy(a)
    assert not np.shares_memory(pfb.to_numpy(t), a)
    a[0] = 100
    assert t.numpy()[0] == 0
    shared = pfb.from_numpy(a, copy=False)
    assert address(shared) == a.ctypes.data


def test_from_numpy_read_only_flag_on_owning_array_is_not_enough():
    a = aligned(np.arange(8))
    a.flags.writeable = False  # can be set back to True: not safe to share
    assert not np.shares_memory(pfb.to_numpy(pfb.from_numpy(a)), a)


def test_from_numpy_copy_true_of_a_view():
    t = tf.constant([1, 2])
    u = pfb.from_numpy(pfb.to_numpy(t), copy=True)
    assert address(u) != address(t)


def test_from_numpy_copy_false_rejects_unaligned():
    a = aligned(np.arange(20))
    with pytest.raises(BufferError, match="64-byte aligned"):
        pfb.from_numpy(a[1:], copy=False)


def test_from_numpy_dtypes_and_strings():
    b = pfb.from_numpy(np.array([1.5, 2.5], ml_dtypes.bfloat16))
    assert b.dtype == tf.bfloat16 and list(b.numpy()) == [1.5, 2.5]
    s = pfb.from_numpy(np.array(["ä", "b"]))
    assert s.dtype == tf.string and list(s.numpy()) == ["ä".encode(), b"b"]
    t = pfb.from_numpy(np.array(["ä", "a\x00"], dtype=np.dtypes.StringDType()))
    assert t.dtype == tf.string and list(t.numpy()) == ["ä".encode(), b"a\x00"]
    with pytest.raises(TypeError, match="from_dlpack"):
        pfb.from_numpy([1, 2])


# ---------------------------------------------- other frameworks (optional)

def test_torch_round_trip_zero_copy(torch):
    t = tf.constant(np.arange(6, dtype=np.float32))
    x = torch.from_dlpack(pfb.to_dlpack(t))
    assert x.data_ptr() == address(t)
    y = torch.arange(6, dtype=torch.float32) * 2   # torch's allocator aligns to 64
    u = pfb.from_dlpack(y)
    assert address(u) == y.data_ptr()
    del y
    collect()
    np.testing.assert_array_equal(u.numpy(), np.arange(6) * 2)  # u holds torch's memory
    c = pfb.from_dlpack(torch.arange(3.0), copy=True)
    assert address(c) % 64 == 0


def test_torch_non_contiguous_and_bool(torch):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).T
    u = pfb.from_dlpack(x)
    np.testing.assert_array_equal(u.numpy(), x.numpy())
    with pytest.raises(BufferError, match="not C-contiguous"):
        pfb.from_dlpack(x, copy=False)
    b = pfb.from_dlpack(torch.tensor([True, False]))
    assert b.dtype == tf.bool
    back = torch.from_dlpack(pfb.to_dlpack(b))
    assert back.dtype == torch.bool and back.data_ptr() == address(b)


def test_jax_round_trip(jax):
    jnp = jax.numpy
    j = jnp.arange(8, dtype=jnp.float32)
    u = pfb.from_dlpack(j)
    assert address(u) == j.unsafe_buffer_pointer()  # JAX -> TF: zero-copy
    back = jax.dlpack.from_dlpack(pfb.to_dlpack(u))
    np.testing.assert_array_equal(np.asarray(back), np.arange(8))
    c = pfb.from_dlpack(j, copy=True)
    assert address(c) != j.unsafe_buffer_pointer()


def test_tf_numpy_torch_jax_tf_chain(torch, jax):
    t = tf.constant(np.arange(4, dtype=np.float32))
    x = torch.from_dlpack(pfb.to_dlpack(pfb.from_numpy(pfb.to_numpy(t))))
    assert x.data_ptr() == address(t)
    u = pfb.from_dlpack(jax.dlpack.from_dlpack(pfb.to_dlpack(pfb.from_dlpack(x))))
    np.testing.assert_array_equal(u.numpy(), np.arange(4))
