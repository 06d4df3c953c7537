"""The one call path: what the conversion layer hands the kernel is always
compact, aligned memory (so the kernel never copies a second time), the one
copy= validation, and the bridge's own frames hidden by module, not file name."""
import ctypes

import numpy as np
import pytest
import tensorflow as tf

import dlpack_ctypes as dl
import pyfunc_bridge as pfb
from conftest import collect

conv = pfb._library.conversion()


def test_py_function_ndarray_result_is_copied_once_into_aligned_memory(api, registered):
    # py_function results are held by the wrapper's list, so an ndarray is
    # copied: that copy must be the kernel's tensor as it is (aligned, no
    # strides), else the kernel would copy it again.  NumPy's own allocator
    # aligns small blocks to 16 bytes only: 20 sizes catch any such copy.
    for n in range(1, 21):
        made = {}

        def func():
            made["array"] = np.arange(n, dtype=np.float32)
            return [made["array"]]

        code, message, outs = dl.call(api, registered(func), [], [dl.spec()],
                                      flags=dl.PFB_CALL_TENSORS)
        assert code == 0, message
        out = outs[0].contents.dl_tensor
        assert out.data % 64 == 0, n
        assert not out.strides
        assert out.data != made["array"].ctypes.data  # copied (the list holds it)
        values = np.ctypeslib.as_array(ctypes.cast(out.data, ctypes.POINTER(ctypes.c_float)),
                                       (n,))
        assert values.tolist() == list(range(n))
        dl.release(outs)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_py_function_ndarray_result_counts_one_copy(mode):
    x = tf.range(10, dtype=tf.float32)

    def run():
        return pfb.py_function(lambda a: a.numpy() * 2, [x], tf.float32, name="ndarray_out")

    if mode == "tf_function":
        run = tf.function(run)
    previous = pfb.enable_stats(True)
    try:
        pfb.reset_stats()
        y = run()
        got = pfb.stats().functions["ndarray_out"]
    finally:
        pfb.enable_stats(previous)
    np.testing.assert_array_equal(y.numpy(), np.arange(10) * 2)
    assert got.bytes_zero_copy == 40  # the input
    assert got.bytes_copied["aliasing"] == 40  # the result, once
    assert got.bytes_copied_total == 40


def test_compact_result_with_strides_is_handed_over_without_them(api):
    torch = pytest.importorskip("torch")
    from pyfunc_bridge import _frameworks
    adapter = _frameworks.adapter("torch")
    made = {}

    def func():
        made["address"] = (t := torch.ones(4, 64)).data_ptr()
        return t

    # The registry holds entries weakly: keep this one alive for the call.
    entry = pfb._registry.register(func, adapter)
    code, message, outs = dl.call(api, entry.key, [], [dl.spec()])
    assert code == 0, message
    out = outs[0].contents.dl_tensor
    assert out.data == made["address"]  # zero-copy: a fresh torch tensor
    assert not out.strides  # torch gave strides; the kernel takes none
    assert out.ndim == 2 and out.shape[0] == 4 and out.shape[1] == 64
    dl.release(outs)
    del entry
    collect()


@pytest.mark.parametrize("convert", [
    lambda copy: pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32, copy=copy),
    lambda copy: pfb.to_numpy(tf.constant(1.0), copy=copy),
    lambda copy: pfb.from_numpy(np.zeros(2), copy=copy),
    lambda copy: pfb.to_dlpack(tf.constant(1.0)).__dlpack__(copy=copy),
], ids=["numpy_function", "to_numpy", "from_numpy", "__dlpack__"])
def test_copy_is_validated_the_same_everywhere(convert):
    with pytest.raises(ValueError, match=r"copy must be None, True or False, got 'yes'"):
        convert("yes")


def test_copy_policy_maps_copy_to_the_attribute_and_mode():
    assert conv.copy_policy(None) == ("none", 0)
    assert conv.copy_policy(True) == ("true", 1)
    assert conv.copy_policy(False) == ("false", 2)
    with pytest.raises(ValueError, match="copy must be None, True or False"):
        conv.copy_policy(1)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_error_traceback_keeps_user_frames_and_drops_the_bridges(mode):
    def user_function_that_fails(a):
        raise ValueError("boom")

    def run():
        return pfb.numpy_function(user_function_that_fails, [tf.constant(1.0)], tf.float32)

    if mode == "tf_function":
        run = tf.function(run)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run()
    message = info.value.message
    assert "boom" in message
    assert "user_function_that_fails" in message
    assert "converters.pxi" not in message and "bridge.pxi" not in message


def test_dtype_table_derives_the_supported_dtypes():
    names = set(conv.DTYPE_NAMES)
    assert {"float32", "bfloat16", "bool", "complex128", "string"} <= names
    assert {d.name for d in pfb._tout.supported_dtypes()} == names
