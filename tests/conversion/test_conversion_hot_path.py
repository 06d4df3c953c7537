"""The per-call fast path: a kernel caches what its key resolved to
(PfbCall.site), weakly, and the statistics find their record without a name.
Zero copy by address, lifetimes, the cache's refresh and its errors, and
exact counts under concurrent calls."""
import ctypes
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

import dlpack_ctypes as dl
import pyfunc_bridge as pfb
from conftest import collect

conv = pfb._library.conversion()
with conv.aligned_allocation():  # aligned: a result over it can be shared
    X = np.arange(256, dtype=np.float32)


@pytest.fixture
def site():
    """A kernel's site slot; released as the kernel releases it."""
    slot = ctypes.c_void_p()
    yield slot
    dl.release_site(slot)


def _identity_call(api, key, site, producer, array=X):
    # copy=False: the zero-copy views whatever the input's flags
    m = producer.tensor(array)
    code, message, outs = dl.call(api, key, [m], [dl.spec()], site=site, copy_mode=2)
    return code, message, outs


def test_site_is_filled_and_reused_with_zero_copy_both_ways(api, site):
    seen = []

    def func(a):
        seen.append(a.ctypes.data)
        return a

    entry = pfb._registry.register(func)
    producer = dl.Producer()
    for _ in range(3):
        code, message, outs = _identity_call(api, entry.key, site, producer)
        assert code == 0, message
        assert seen[-1] == X.ctypes.data  # the input is a view of the producer's memory
        assert outs[0].contents.dl_tensor.data == X.ctypes.data  # the result too
        dl.release(outs)
    cached = dl.site_object(site)
    assert type(cached).__name__ == "_Site"
    for _ in range(2):  # later calls keep the same cached object
        code, message, outs = _identity_call(api, entry.key, site, producer)
        assert code == 0, message
        dl.release(outs)
    assert dl.site_object(site) is cached
    collect()
    assert producer.deleted == 5  # every input freed


def test_site_does_not_keep_the_entry_or_function_alive(api, site):
    def func(a):
        return a + 1

    entry = pfb._registry.register(func)
    key = entry.key
    entry_ref, func_ref = weakref.ref(entry), weakref.ref(func)
    producer = dl.Producer()
    code, message, outs = _identity_call(api, key, site, producer)
    assert code == 0, message
    out = outs[0].contents.dl_tensor
    assert out.data != X.ctypes.data  # a fresh result: not the input's memory
    dl.release(outs)
    assert dl.site_object(site) is not None
    del entry, func
    collect()
    assert entry_ref() is None and func_ref() is None
    # The cached site is stale: the call looks the key up again, and fails as
    # a key that nobody registered does.
    code, message, outs = _identity_call(api, key, site, producer)
    assert code == 3  # InvalidArgument
    assert key in message and "no Python function is registered" in message


def test_site_follows_a_key_registered_again(api, site, registry):
    # A key whose entry went can be registered again (a portable function
    # resolved anew): the stale site is replaced, the new function runs.
    first = pfb._registry.register(lambda a: a * 2)
    key = first.key
    producer = dl.Producer()
    code, message, outs = _identity_call(api, key, site, producer)
    assert code == 0, message
    assert np.ctypeslib.as_array(ctypes.cast(outs[0].contents.dl_tensor.data,
                                             ctypes.POINTER(ctypes.c_float)), (256,))[3] == 6
    dl.release(outs)
    stale = dl.site_object(site)
    del first
    collect()
    second = pfb._registry.Entry(lambda a: a * 3, key)
    registry[key] = weakref.ref(second)
    try:
        code, message, outs = _identity_call(api, key, site, producer)
        assert code == 0, message
        values = np.ctypeslib.as_array(ctypes.cast(outs[0].contents.dl_tensor.data,
                                                   ctypes.POINTER(ctypes.c_float)), (256,))
        assert values[3] == 9
        dl.release(outs)
        assert dl.site_object(site) is not stale
    finally:
        registry.pop(key, None)


class _Unreferenceable:
    """An entry-like object that cannot be weakly referenced."""
    __slots__ = ("func", "converter", "name", "stats_record")

    def __init__(self, func):
        self.func = func
        self.converter = conv.converter(None)
        self.name = "unreferenceable"
        self.stats_record = None


def test_entry_without_weakref_support_runs_uncached(api, site, registry):
    entry = _Unreferenceable(lambda a: a)
    key = "tests:unreferenceable@1"
    registry[key] = lambda: entry  # the registry holds callables returning entries
    try:
        for _ in range(2):
            code, message, outs = _identity_call(api, key, site, dl.Producer())
            assert code == 0, message
            dl.release(outs)
        assert dl.site_object(site) is None  # nothing cached
    finally:
        registry.pop(key, None)


def test_foreign_entry_without_converter_fails_cleanly_and_caches_nothing(api, site, registry):
    class Foreign:
        func = staticmethod(lambda a: a)
        converter = "not a converter"

    entry = Foreign()
    key = "tests:foreign@1"
    registry[key] = weakref.ref(entry)
    try:
        code, message, outs = _identity_call(api, key, site, dl.Producer())
        assert code == 3, message  # TypeError -> InvalidArgument
        assert "_Converter" in message
        assert dl.site_object(site) is None
    finally:
        registry.pop(key, None)


def test_graph_kernel_does_not_keep_the_function_alive():
    def func(a):
        return a

    func_ref = weakref.ref(func)
    run = tf.function(lambda x: pfb.numpy_function(func, [x], tf.float32))
    x = tf.constant(X)
    for _ in range(3):  # the kernel's site is filled by the first call
        y = run(x)
    np.testing.assert_array_equal(y.numpy(), X)
    entries = [ref() for ref in conv.registry().values()]
    assert any(e is not None and e.func is func for e in entries)
    del func, run, y, entries
    collect()
    assert func_ref() is None


def test_graph_results_keep_zero_copy_and_input_lifetimes():
    seen = []

    def func(a):
        seen.append(weakref.ref(a))
        return a

    run = tf.function(lambda x: pfb.numpy_function(func, [x], tf.float32))
    x = tf.constant(X)
    for _ in range(200):
        y = run(x)
    np.testing.assert_array_equal(y.numpy(), X)
    collect()
    # No view of an input outlives its call: results alias TF's buffers.
    assert all(ref() is None for ref in seen)


def test_parallel_map_counts_add_up_exactly(stats_on):
    n = 400

    def func(a):
        return a

    def plus(a):
        return a + 1

    ds = tf.data.Dataset.from_tensors(tf.constant(X)).repeat(n).map(
        lambda v: pfb.numpy_function(plus, [pfb.numpy_function(func, [v], tf.float32,
                                                                name="hot_identity")],
                                     tf.float32, name="hot_plus"),
        num_parallel_calls=8, deterministic=False)
    total = sum(float(v.numpy()[3]) for v in ds)
    stats = pfb.stats().functions
    assert total == n * 4.0
    assert stats["hot_identity"].calls == n and stats["hot_plus"].calls == n
    assert stats["hot_identity"].errors == 0
    # The dataset's one tensor is shared by every element: copied on the way
    # in, so that the function may write it; that copy goes on zero-copy, and
    # the next call holds it alone (IS_COPIED): zero-copy both ways.
    assert stats["hot_identity"].bytes_zero_copy == n * X.nbytes
    assert stats["hot_identity"].bytes_copied_total == n * X.nbytes
    assert stats["hot_identity"].bytes_copied["shared_input"] == n * X.nbytes
    assert stats["hot_plus"].bytes_zero_copy == n * 2 * X.nbytes
    assert stats["hot_identity"].seconds_in_function > 0


def test_threads_calling_one_graph_concurrently_count_exactly(stats_on):
    errors = []
    run = tf.function(lambda x: pfb.numpy_function(lambda a: a[::-1].copy(), [x], tf.float32,
                                                   name="hot_threads"))
    x = tf.constant(X)
    run(x)

    def worker():
        try:
            for _ in range(100):
                assert run(x).numpy()[0] == 255.0
        except BaseException as exc:  # reported below
            errors.append(exc)

    pfb.reset_stats()
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = pfb.stats().functions["hot_threads"]
    assert not errors
    assert got.calls == 600


def test_eager_records_found_again_by_function_and_name(stats_on):
    # Eager calls make an entry per call; the last record found is reused only
    # for the same function under the same name.
    def first(a):
        return a

    def second(a):
        return a

    for _ in range(3):
        pfb.numpy_function(first, [X], tf.float32)
        pfb.numpy_function(second, [X], tf.float32)
        pfb.numpy_function(first, [X], tf.float32, name="renamed")
        pfb.numpy_function(first, [X], tf.float32, name="renamed")
    stats = pfb.stats().functions
    key_first = [k for k in stats if k.endswith("first")]
    key_second = [k for k in stats if k.endswith("second")]
    assert len(key_first) == 1 and len(key_second) == 1
    assert stats[key_first[0]].calls == 3
    assert stats[key_second[0]].calls == 3
    assert stats["renamed"].calls == 6


def test_statistics_times_are_seconds(stats_on):
    import time
    run = tf.function(lambda x: pfb.numpy_function(
        lambda a: (time.sleep(0.05), a)[1], [x], tf.float32, name="hot_sleep"))
    run(tf.constant(X))
    got = pfb.stats().functions["hot_sleep"]
    assert 0.05 <= got.seconds_in_function < 5
    assert 0 < got.seconds_marshalling < 1


# A result that is the bridge's whole view of an input, referenced by nothing
# else, hands the input's own tensor back (the kernel then outputs TF's input
# tensor itself): the output struct is the input struct.  The input is a
# read-only view (copy=False, or any input TF shares), or one that is the
# call's alone (IS_COPIED) under the default.

def _given_back(func, dtype_spec=None, flags=dl.READ_ONLY, copy_mode=2, array=X):
    entry = pfb._registry.register(func)
    producer = dl.Producer()
    m = producer.tensor(array, flags=flags)
    api = dl.bridge_api(conv._bridge_api)
    code, message, outs = dl.call(api, entry.key, [m], [dtype_spec or dl.spec()],
                                  copy_mode=copy_mode)
    assert code == 0, message
    return producer, m, outs


def test_an_input_that_is_the_calls_alone_is_given_back_as_the_input_tensor():
    def write_and_pass(a):
        a += 1  # in place: the memory is the call's alone
        return a

    with conv.aligned_allocation():
        own = np.arange(256, dtype=np.float32)
    producer, m, outs = _given_back(write_and_pass, flags=dl.IS_COPIED, copy_mode=0,
                                    array=own)
    assert ctypes.addressof(outs[0].contents) == ctypes.addressof(m)  # the same struct
    np.testing.assert_array_equal(own, np.arange(256) + 1)  # written where it lives
    dl.release(outs)
    assert producer.deleted == 1


def test_a_kept_view_of_an_input_that_is_the_calls_alone_is_copied_out():
    kept = []

    def keep(a):
        kept.append(a[:])  # Python could write it after the call
        return a

    producer, m, outs = _given_back(keep, flags=dl.IS_COPIED, copy_mode=0)
    assert outs[0].contents.dl_tensor.data != X.ctypes.data
    dl.release(outs)
    del kept[:]
    collect()
    assert producer.deleted == 1


def test_whole_input_view_is_given_back_as_the_input_tensor(stats_on):
    def passthrough(a):
        return a

    producer, m, outs = _given_back(passthrough)
    assert ctypes.addressof(outs[0].contents) == ctypes.addressof(m)  # the same struct
    assert outs[0].contents.dl_tensor.data == X.ctypes.data
    collect()
    assert producer.deleted == 0  # the output owns the input now
    dl.release(outs)
    assert producer.deleted == 1  # freed once, by the output's deleter
    [stats] = [v for k, v in pfb.stats().functions.items() if k.endswith("passthrough")]
    assert stats.calls == 1
    assert stats.bytes_zero_copy == 2 * X.nbytes  # in and out, as before
    assert sum(stats.bytes_copied.values()) == 0


@pytest.mark.parametrize("keep", ["global", "weakref", "second_view"])
def test_input_view_reachable_after_the_call_is_not_given_back(keep):
    kept = []

    def func(a):
        kept.append({"global": a, "weakref": weakref.ref(a), "second_view": a[:]}[keep])
        return a

    producer, m, outs = _given_back(func)
    assert ctypes.addressof(outs[0].contents) != ctypes.addressof(m)
    assert outs[0].contents.dl_tensor.data == X.ctypes.data  # still zero copy
    dl.release(outs)
    collect()
    if keep == "weakref":
        assert producer.deleted == 1
    else:
        assert producer.deleted == 0  # the kept view still needs the memory
        view = kept[0]
        np.testing.assert_array_equal(view, X)
        del view, kept[:]
        collect()
        assert producer.deleted == 1


@pytest.mark.parametrize("case", ["reshaped", "other_dtype"])
def test_view_of_an_input_with_another_shape_or_dtype_is_not_given_back(case):
    def func(a):
        return a.reshape(16, 16) if case == "reshaped" else a.view(np.int32)

    out_spec = dl.spec() if case == "reshaped" else dl.spec(code=dl.kDLInt)
    producer, m, outs = _given_back(func, out_spec)
    out = outs[0].contents.dl_tensor
    assert ctypes.addressof(outs[0].contents) != ctypes.addressof(m)
    assert out.data == X.ctypes.data
    assert [out.shape[i] for i in range(out.ndim)] == ([16, 16] if case == "reshaped" else [256])
    dl.release(outs)
    collect()
    assert producer.deleted == 1


def test_input_returned_twice_is_not_given_back_and_freed_once():
    # Only a sole result is given back: a second export of the same view
    # must not depend on the first output's lifetime.
    def func(a):
        return a, a

    entry = pfb._registry.register(func)
    producer = dl.Producer()
    m = producer.tensor(X)
    api = dl.bridge_api(conv._bridge_api)
    code, message, outs = dl.call(api, entry.key, [m], [dl.spec(), dl.spec()], copy_mode=2)
    assert code == 0, message
    assert all(ctypes.addressof(o.contents) != ctypes.addressof(m) for o in outs)
    assert all(o.contents.dl_tensor.data == X.ctypes.data for o in outs)
    dl.release(outs[:1])
    collect()
    assert producer.deleted == 0  # the second output still holds the input
    dl.release(outs[1:])
    collect()
    assert producer.deleted == 1


def test_input_freed_once_when_an_output_fails():
    def func(a):
        return a, "not a number"

    entry = pfb._registry.register(func)
    producer = dl.Producer()
    m = producer.tensor(X)
    api = dl.bridge_api(conv._bridge_api)
    code, message, outs = dl.call(api, entry.key, [m], [dl.spec(), dl.spec()])
    assert code == 3 and "output 1" in message  # InvalidArgument
    assert not outs[0] and not outs[1]  # the bridge freed what it had made
    collect()
    assert producer.deleted == 1


def test_graph_identity_outputs_the_input_tensor_itself():
    run = tf.function(lambda x: pfb.numpy_function(lambda a: a, [x], tf.float32, copy=False))
    x = tf.constant(X)
    for _ in range(3):
        y = run(x)
    assert np.asarray(y).ctypes.data == np.asarray(x).ctypes.data
    np.testing.assert_array_equal(y.numpy(), X)
    del x
    collect()
    np.testing.assert_array_equal(y.numpy(), X)  # the output holds TF's buffer


@pytest.mark.parametrize("func", [np.negative, lambda a: a[()], lambda a: float(a)],
                         ids=["ufunc", "numpy_scalar", "python_float"])
def test_scalar_results_of_a_scalar_input_are_never_given_back(func):
    # A 0-d input arrives as a NumPy scalar; the result is no view of it.
    run = tf.function(lambda x: pfb.numpy_function(func, [x], tf.float32))
    for value in (2.0, -3.5):
        expected = np.float32(func(np.float32(value)))
        assert run(tf.constant(value)).numpy() == expected
