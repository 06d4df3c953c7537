"""pfb.array_function: torch / JAX arrays in and out of a TF op, through the
numpy_function kernel.  Zero-copy by addresses, copies by their negation,
error paths by their messages."""
import sys

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from pyfunc_bridge import _frameworks
import dlpack_ctypes as dl
import process_functions as pf
from conftest import address, collect

conv = pfb._library.conversion()
X = np.arange(16, dtype=np.float32)


def run_modes(build, *args):
    """The op's result eagerly, then inside a tf.function (one at a time, so
    that what the function saw belongs to the result being checked)."""
    yield build(*args)
    yield tf.function(build)(*args)


# ------------------------------------------------------------------- torch

def test_torch_inputs_share_tf_memory_and_fresh_outputs_come_back_zero_copy(torch):
    seen = {}

    def f(a, b):
        seen["inputs"] = (type(a), a.data_ptr(), b.data_ptr())
        out = a * b
        seen["output"] = out.data_ptr()
        return out

    x, y = tf.constant(X), tf.constant(X + 1)
    for result in run_modes(lambda x, y: pfb.array_function(
            f, [x, y], tf.float32, framework="torch", copy=False), x, y):
        assert seen["inputs"] == (torch.Tensor, address(x), address(y))
        assert address(result) == seen["output"]
        np.testing.assert_array_equal(result.numpy(), X * (X + 1))
    # By default an input TF shares (x, held here) is a private copy the function may write.
    for result in run_modes(lambda x, y: pfb.array_function(
            f, [x, y], tf.float32, framework="torch"), x, y):
        assert seen["inputs"][0] is torch.Tensor
        assert address(x) not in seen["inputs"] and address(y) not in seen["inputs"]
        np.testing.assert_array_equal(result.numpy(), X * (X + 1))


def test_torch_identity_and_view_of_input_alias_the_input(torch):
    x = tf.constant(X)
    same = pfb.array_function(lambda a: a, [x], tf.float32, framework="torch", copy=False)
    assert address(same) == address(x)
    half = pfb.array_function(lambda a: a[:8], [x], tf.float32, framework="torch",
                              copy=False)
    assert address(half) == address(x)


def test_torch_results_python_can_still_write_are_copied(torch):
    keep = torch.arange(16, dtype=torch.float32)
    base_holder = torch.arange(32, dtype=torch.float32)
    from_numpy = np.arange(16, dtype=np.float32)
    cases = {
        "global": lambda a: keep,
        "view of a global": lambda a: base_holder[16:],
        "view of a fresh tensor kept by its base": lambda a: (lambda b: (b, b[:16]))(
            torch.arange(32, dtype=torch.float32))[1],
        "torch.from_numpy": lambda a: torch.from_numpy(from_numpy),
    }
    x = tf.constant(X)
    for name, func in cases.items():
        result = pfb.array_function(func, [x], tf.float32, framework="torch")
        got = pfb.to_numpy(result)
        for memory in (keep, base_holder):
            assert not np.shares_memory(got, memory.numpy()), name
        assert not np.shares_memory(got, from_numpy), name
    keep += 1  # the tensor made from it does not change
    assert pfb.array_function(lambda a: keep, [x], tf.float32,
                              framework="torch").numpy()[0] == 1


def test_torch_copy_false_refuses_aliased_results(torch):
    keep = torch.zeros(16)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0 would need a copy because its memory is still"):
        pfb.array_function(lambda a: keep, [tf.constant(X)], tf.float32,
                           framework="torch", copy=False)
    ok = pfb.array_function(lambda a: a + 1, [tf.constant(X)], tf.float32,
                            framework="torch", copy=False)
    np.testing.assert_array_equal(ok.numpy(), X + 1)


def test_torch_copy_true_gives_private_inputs_and_copied_outputs(torch):
    seen = {}

    def f(a):
        a.add_(1)  # allowed: a private copy
        seen["input"], seen["output"] = a.data_ptr(), a.data_ptr()
        return a

    x = tf.constant(X)
    result = pfb.array_function(f, [x], tf.float32, framework="torch", copy=True)
    assert seen["input"] != address(x)
    assert address(result) != seen["output"]
    np.testing.assert_array_equal(result.numpy(), X + 1)
    np.testing.assert_array_equal(x.numpy(), X)


def test_torch_in_place_write_to_an_input_fails_the_op_under_copy_false(torch):
    def f(a):
        a.mul_(2)
        return a

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="wrote to input 0 in place.*copy=None"):
        pfb.array_function(f, [tf.constant(X)], tf.float32, framework="torch", copy=False)
    x = tf.constant(X)
    np.testing.assert_array_equal(
        pfb.array_function(f, [x], tf.float32, framework="torch").numpy(), X * 2)
    np.testing.assert_array_equal(x.numpy(), X)


def test_torch_dtype_and_shape_errors_name_the_output(torch):
    x = tf.constant(X)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0: Tout declares float32 but the function returned a "
                             "Tensor of dtype float64"):
        pfb.array_function(lambda a: a.double(), [x], tf.float32, framework="torch")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"output 1: Tout declares shape \(4, 4\) but the function "
                             r"returned a Tensor of shape \(16,\)"):
        pfb.array_function(lambda a: (a, a), [x],
                           [tf.float32, tf.TensorSpec([4, 4], tf.float32)],
                           framework="torch")


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ["complex32", "float8_e4m3fn"])
def test_torch_result_of_a_dtype_the_bridge_cannot_take_names_it(torch, dtype):
    """A result whose dtype has no DLPack code the bridge converts (torch's
    complex32, float8) fails as a wrong result does, naming the output, the
    dtype and the fix, in every mode."""
    args = [tf.constant(3), tf.constant(dtype)]
    want = (rf"output 0: the function returned a Tensor of dtype torch\.{dtype}, which "
            rf"pyfunc_bridge cannot hand to TensorFlow \(unsupported DLPack dtype .*\); Tout "
            rf"declares complex64: convert the result to complex64 before returning it")
    for call in (lambda: pfb.array_function(pf.torch_zeros_of, args, tf.complex64,
                                            framework="torch"),
                 tf.function(lambda: pfb.array_function(pf.torch_zeros_of, args, tf.complex64,
                                                        framework="torch")),
                 lambda: pfb.py_function(pf.torch_zeros_of, args, tf.complex64)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=want):
            call()


def test_torch_result_its_own_export_refuses_names_it(torch):
    """torch's own DLPack export refuses bit types: the same words as a dtype
    the bridge refuses."""
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"output 0: the function returned a Tensor of dtype torch\.bits16, "
                             r"which pyfunc_bridge cannot hand to TensorFlow \(.*\); Tout "
                             r"declares int16: convert the result to int16"):
        pfb.array_function(lambda a: torch.zeros(4, dtype=torch.int16).view(torch.bits16),
                           [tf.constant(X)], tf.int16, framework="torch")


def test_torch_mixed_results_and_string_inputs(torch):
    def f(a, s):
        assert s.dtype == object  # strings arrive as object arrays of bytes
        return a.sum(), np.int64(len(s)), [b"x" + v for v in s], a > 3

    x, s = tf.constant(X), tf.constant([b"p", b"q"])
    total, n, strings, mask = pfb.array_function(
        f, [x, s], [tf.float32, tf.int64, tf.string, tf.bool], framework="torch")
    assert total.numpy() == X.sum() and n.numpy() == 2
    assert list(strings.numpy()) == [b"xp", b"xq"]
    np.testing.assert_array_equal(mask.numpy(), X > 3)


def test_torch_in_tf_data(torch):
    def square(i):
        return i * i

    ds = tf.data.Dataset.range(200).map(
        lambda i: pfb.array_function(square, [i], tf.int64, framework="torch"),
        num_parallel_calls=4)
    assert sorted(int(v) for v in ds) == [i * i for i in range(200)]


def test_torch_output_memory_lives_as_long_as_the_tensor(torch):
    result = pfb.array_function(lambda a: torch.full((1000,), 7.0), [tf.constant(X)],
                                tf.float32, framework="torch")
    collect()
    assert (result.numpy() == 7.0).all()


# --------------------------------------------------------------------- JAX

def test_jax_function_in_tf_function_and_outputs_zero_copy(jax):
    jnp = jax.numpy
    seen = {}

    def f(a):
        seen["type"] = type(a)
        out = jnp.tanh(a) + 1
        seen["output"] = out.unsafe_buffer_pointer()
        return out

    x = tf.constant(X / 16)
    for result in run_modes(lambda x: pfb.array_function(
            f, [x], tf.TensorSpec([16], tf.float32), framework="jax"), x):
        assert issubclass(seen["type"], jax.Array)
        assert address(result) == seen["output"]  # immutable: never needs a copy
        np.testing.assert_allclose(result.numpy(), np.tanh(X / 16) + 1, rtol=1e-6)


def test_jax_inputs_share_tf_memory(jax):
    """jax.dlpack.from_dlpack shares 64-byte aligned CPU memory, as
    TensorFlow's is: no copy in, and a pass-through goes back without one."""
    seen = {}

    def f(a):
        seen["input"] = a.unsafe_buffer_pointer()
        return a
    x = tf.constant(X)
    result = pfb.array_function(f, [x], tf.float32, framework="jax")
    assert seen["input"] == address(x) == address(result)


def test_jax_bfloat16_results(jax):
    """NumPy exports no ml_dtypes type by DLPack: a JAX bfloat16 result goes by
    JAX's own export, eagerly, in a graph and under XLA."""
    jnp = jax.numpy
    f = lambda x: pfb.array_function(  # noqa: E731
        lambda a: (a * 2).astype(jnp.bfloat16), [x], tf.TensorSpec([4], tf.bfloat16),
        framework="jax")
    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    for run in (f, tf.function(f), tf.function(f, jit_compile=True)):
        result = run(x)
        assert result.dtype == tf.bfloat16
        np.testing.assert_array_equal(tf.cast(result, tf.float32).numpy(), [2, 4, 6, 8])


def test_jax_copy_true_copies_outputs(jax):
    seen = {}

    def f(a):
        out = a * 2
        seen["output"] = out.unsafe_buffer_pointer()
        return out

    result = pfb.array_function(f, [tf.constant(X)], tf.float32, framework="jax",
                                copy=True)
    assert address(result) != seen["output"]


def test_jax_in_tf_data(jax):
    ds = tf.data.Dataset.range(100).map(lambda i: tf.cast(i, tf.int32)).map(
        lambda i: pfb.array_function(lambda a: a + 1, [i], tf.int32, framework="jax"),
        num_parallel_calls=2)
    assert sorted(int(v) for v in ds) == list(range(1, 101))


def test_jax_without_x64_refuses_64_bit_inputs(jax):
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 is on")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="JAX converted a int64 input to int32.*jax_enable_x64"):
        pfb.array_function(lambda a: a, [tf.constant([2 ** 40])], tf.int64,
                           framework="jax")


def test_results_of_another_framework_are_judged_by_theirs(torch, jax):
    jnp = jax.numpy
    seen = {}

    def f(a):  # a torch function returning a JAX array
        out = jnp.asarray(a.numpy()) * 3
        seen["output"] = out.unsafe_buffer_pointer()
        return out

    result = pfb.array_function(f, [tf.constant(X)], tf.float32, framework="torch")
    assert address(result) == seen["output"]
    np.testing.assert_array_equal(result.numpy(), X * 3)


# ------------------------------------------- any __dlpack__ result (ctypes)

class _Trusted(_frameworks.Adapter):
    """Vouches that dlpack_ctypes.Exporter results cannot change after the call."""
    name, modules = "trusted-test-producer", ("dlpack_ctypes",)

    def writable_elsewhere(self, obj, outside_refs):
        return False


@pytest.fixture
def trusted_ctypes_exports():
    conv.register_framework(_Trusted())
    yield
    conv.register_framework(_Untrusted())  # back to "unknown: copy"


class _Untrusted(_frameworks.Adapter):
    name, modules = "untrusted-test-producer", ("dlpack_ctypes",)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_unknown_dlpack_result_is_copied_and_freed_at_once(torch, versioned):
    producer = dl.Producer()
    with conv.aligned_allocation():
        memory = np.arange(16, dtype=np.float32)

    def f(a):
        return dl.Exporter(producer.capsule(memory, versioned=versioned))

    result = pfb.array_function(f, [tf.constant(X)], tf.float32, framework="torch")
    assert not np.shares_memory(pfb.to_numpy(result), memory)
    collect()
    assert producer.deleted == 1
    # The ctypes capsule destructor runs Python code, which it must not do
    # while an error propagates: keep the refused exporter alive until then.
    refused = dl.Exporter(producer.capsule(memory, versioned=versioned))
    with pytest.raises(tf.errors.InvalidArgumentError, match="would need a copy"):
        pfb.array_function(lambda a: refused, [tf.constant(X)], tf.float32,
                           framework="torch", copy=False)
    del refused
    collect()
    assert producer.deleted == 2


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_trusted_dlpack_result_is_handed_over_and_freed_with_the_tensor(
        torch, trusted_ctypes_exports, versioned):
    producer = dl.Producer()
    with conv.aligned_allocation():
        memory = np.arange(16, dtype=np.float32)
    result = pfb.array_function(
        lambda a: dl.Exporter(producer.capsule(memory, versioned=versioned)),
        [tf.constant(X)], tf.float32, framework="torch")
    assert address(result) == memory.ctypes.data
    collect()
    assert producer.deleted == 0  # TF's tensor owns it now
    del result
    collect()
    assert producer.deleted == 1


def test_trusted_but_unaligned_result_is_copied(torch, trusted_ctypes_exports):
    producer = dl.Producer()
    with conv.aligned_allocation():
        memory = np.arange(17, dtype=np.float32)
    result = pfb.array_function(
        lambda a: dl.Exporter(producer.capsule(memory[1:])),
        [tf.constant(X)], tf.float32, framework="torch")
    assert not np.shares_memory(pfb.to_numpy(result), memory)
    np.testing.assert_array_equal(result.numpy(), memory[1:])


def test_malformed_dlpack_result_fails_the_op(torch):
    producer = dl.Producer()
    bad = dl.Exporter(producer.capsule(np.zeros(4, np.float32), shape=[-1]))
    with pytest.raises(tf.errors.UnknownError, match="BufferError.*negative dimension"):
        pfb.array_function(lambda a: bad, [tf.constant(X)], tf.float32, framework="torch")


def test_cuda_result_is_a_clear_error_on_the_cpu_kernel(torch):
    fake_gpu = dl.Exporter(None, device=(dl.kDLCUDA, 0))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="output 0 is an? Exporter in device memory.*CPU kernel"):
        pfb.array_function(lambda a: fake_gpu, [tf.constant(X)], tf.float32,
                           framework="torch")
    assert fake_gpu.calls == []  # not asked to export


# ------------------------------------------------------------ construction

def test_numpy_framework_is_numpy_function():
    x = tf.constant(X)
    result = pfb.array_function(lambda a: a, [x], tf.float32, framework="numpy", copy=False)
    assert address(result) == address(x)


def test_unknown_frameworks():
    with pytest.raises(ValueError,
                       match="framework must be one of 'numpy', 'torch', 'jax', 'cupy'"):
        pfb.array_function(lambda a: a, [X], tf.float32, framework="mxnet")
    with pytest.raises(TypeError, match="framework"):
        pfb.array_function(lambda a: a, [X], tf.float32)


def test_missing_framework_is_an_import_error_at_graph_construction(monkeypatch):
    monkeypatch.setitem(_frameworks.ADAPTERS, "jax", _frameworks.JaxAdapter())
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax fails
    monkeypatch.setitem(sys.modules, "jax.dlpack", None)

    def build(x):
        return pfb.array_function(lambda a: a, [x], tf.float32, framework="jax")

    spec = tf.TensorSpec([None], tf.float32)
    with pytest.raises(ImportError, match="needs the 'jax' package.*pip install jax"):
        tf.function(build, autograph=False).get_concrete_function(spec)
    # autograph re-raises errors of traced code as its own StagingError
    with pytest.raises(Exception, match="needs the 'jax' package.*pip install jax"):
        tf.function(build).get_concrete_function(spec)


def test_graphs_release_their_functions(torch, registry):
    collect()
    before = len(registry)
    for _ in range(50):
        tf.function(lambda x: pfb.array_function(lambda a: a + 1, [x], tf.float32,
                                                 framework="torch"))(tf.constant(X))
    collect()
    assert len(registry) == before


def test_torch_result_that_requires_grad_is_refused_by_torch(torch):
    weight = torch.ones(16, requires_grad=True)
    with pytest.raises(tf.errors.UnknownError, match="require gradient.*detach"):
        pfb.array_function(lambda a: weight * 2, [tf.constant(X)], tf.float32,
                           framework="torch")
    ok = pfb.array_function(lambda a: (weight * 2).detach(), [tf.constant(X)],
                            tf.float32, framework="torch")
    np.testing.assert_array_equal(ok.numpy(), np.full(16, 2.0))
