"""The conversion layer's py_function path, driven through the bridge API with
a ctypes DLPack producer: DLPack <-> EagerTensors, ownership on every path,
dtype and device checks."""
import ctypes

import numpy as np
import pytest
import tensorflow as tf

import dlpack_ctypes as dl
import pyfunc_bridge as pfb
from conftest import address, collect

conv = pfb._library.conversion()


def release(outputs):
    for m in outputs:
        if m:
            m.contents.deleter(m)


def test_inputs_become_eager_tensors_on_the_producer_memory(api, registered):
    seen = {}

    def func(a):
        seen["type"] = type(a)
        seen["address"] = address(a)
        seen["value"] = a.numpy().copy()
        return [a * 2]

    producer = dl.Producer()
    x = np.zeros(64 + 16, np.float32)
    x = x[(-x.ctypes.data % 64) // 4:][:16]  # 64-byte aligned, as TF's are
    x[:] = np.arange(16)
    code, message, outs = dl.call(api, registered(func), [producer.tensor(x)], [dl.spec()],
                                  flags=dl.PFB_CALL_TENSORS)
    assert code == 0, message
    assert issubclass(seen["type"], tf.Tensor)
    assert seen["address"] == x.ctypes.data
    np.testing.assert_array_equal(seen["value"], np.arange(16))
    out = outs[0].contents.dl_tensor
    assert out.ndim == 1 and out.shape[0] == 16
    assert np.ctypeslib.as_array(ctypes.cast(out.data, ctypes.POINTER(ctypes.c_float)),
                                 (16,)).tolist() == (np.arange(16) * 2).tolist()
    release(outs)
    collect()
    assert producer.deleted == 1  # the EagerTensor released the input


def unaligned_floats(n):
    """Float32 memory that is not 64-byte aligned: the input is copied before TF
    sees it, so the ctypes producer's deleter (a Python callback) runs at once,
    not while the call's error propagates (ctypes cannot enter Python then)."""
    buf = np.zeros(n + 32, np.float32)
    start = (-buf.ctypes.data % 64) // 4 + 1
    return buf[start:start + n]


def test_device_memory_for_a_host_output_is_an_error(api, registered):
    producer = dl.Producer()
    x = unaligned_floats(4)
    on_gpu = dl.Exporter(None, device=(dl.kDLCUDA, 0))
    code, message, outs = dl.call(
        api, registered(lambda a: [on_gpu]), [producer.tensor(x)],
        [dl.spec()], flags=dl.PFB_CALL_TENSORS)
    assert code == 3  # InvalidArgument
    assert "output 0" in message and "device memory" in message
    assert all(not m for m in outs)
    assert on_gpu.calls == []  # refused before the producer exported anything
    collect()
    assert producer.deleted == 1


def test_host_memory_for_a_device_output_goes_to_the_kernel_to_copy(api, registered):
    # A GPU keeps int32 in host memory, and NumPy results live there: the
    # kernel copies them into its device output.
    producer = dl.Producer()
    x = unaligned_floats(4)
    code, message, outs = dl.call(
        api, registered(lambda a: [a + 1]), [producer.tensor(x)],
        [dl.spec(device=(dl.kDLCUDA, 0))], flags=dl.PFB_CALL_TENSORS)
    assert code == 0, message
    out = outs[0].contents.dl_tensor
    assert out.device.device_type == dl.kDLCPU
    assert np.ctypeslib.as_array(ctypes.cast(out.data, ctypes.POINTER(ctypes.c_float)),
                                 (4,)).tolist() == [1.0, 1.0, 1.0, 1.0]
    release(outs)
    collect()
    assert producer.deleted == 1


@pytest.mark.parametrize("code,bits,expected", [
    (dl.kDLBool, 8, "bool"), (dl.kDLInt, 64, "int64"), (dl.kDLFloat, 64, "float64")])
def test_dtype_mismatch_names_both_dtypes(api, registered, code, bits, expected):
    producer = dl.Producer()
    x = unaligned_floats(4)
    status, message, outs = dl.call(
        api, registered(lambda a: [tf.cast(a, tf.uint8)]), [producer.tensor(x)],
        [dl.spec(code, bits)], flags=dl.PFB_CALL_TENSORS)
    assert status == 3
    assert f"Tout declares {expected}" in message and "uint8" in message
    assert all(not m for m in outs)


def test_bool_tensor_results_are_bool(api, registered):
    producer = dl.Producer()
    x = np.arange(4, dtype=np.float32)
    status, message, outs = dl.call(
        api, registered(lambda a: [a > 1]), [producer.tensor(x)],
        [dl.spec(dl.kDLBool, 8)], flags=dl.PFB_CALL_TENSORS)
    assert status == 0, message
    t = outs[0].contents.dl_tensor
    assert (t.dtype.code, t.dtype.bits) == (dl.kDLBool, 8)
    release(outs)


def test_function_error_releases_inputs(api, registered):
    producer = dl.Producer()

    def func(a):
        raise KeyError("nope")

    status, message, outs = dl.call(api, registered(func), [producer.tensor(unaligned_floats(3))],
                                    [dl.spec()], flags=dl.PFB_CALL_TENSORS)
    assert status == 2 and "KeyError" in message
    collect()
    assert producer.deleted == 1


def test_unaligned_input_gets_an_aligned_copy(api, registered):
    seen = {}

    def func(a):
        seen["address"] = address(a)
        return [a + 1]  # a TF kernel on the input: needs aligned memory

    producer = dl.Producer()
    buf = np.zeros(64, np.float32)
    start = (-buf.ctypes.data % 64) // 4 + 1
    x = buf[start:start + 4]
    x[:] = [1, 2, 3, 4]
    assert x.ctypes.data % 64 != 0
    status, message, outs = dl.call(api, registered(func), [producer.tensor(x)], [dl.spec()],
                                    flags=dl.PFB_CALL_TENSORS)
    assert status == 0, message
    assert seen["address"] != x.ctypes.data and seen["address"] % 64 == 0
    out = outs[0].contents.dl_tensor
    assert np.ctypeslib.as_array(ctypes.cast(out.data, ctypes.POINTER(ctypes.c_float)),
                                 (4,)).tolist() == [2, 3, 4, 5]
    release(outs)
    collect()
    assert producer.deleted == 1
