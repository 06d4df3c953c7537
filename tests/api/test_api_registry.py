"""The function registry behind the ops: key format, weak and unique keys,
eager calls that leave no entry, graphs that keep theirs, a missing key."""
import re

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import collect

X = tf.constant([1.0, 2.0, 3.0, 4.0])


# --------------------------------------------------------------------------
# The function registry.

KEY_RE = re.compile(r"^(?P<ref>.+)@(?P<uid>[0-9a-f]{32})$")


def module_level_function(a):
    return a


class _Callable:
    def __call__(self, a):
        return a

    def method(self, a):
        return a


@pytest.mark.parametrize("func,ref", [
    (module_level_function, f"{__name__}:module_level_function"),
    (_Callable().method, f"{__name__}:_Callable.method"),
    (_Callable(), f"{__name__}:_Callable"),
    (lambda a: a, f"{__name__}:<lambda>"),
], ids=["function", "method", "callable_object", "lambda"])
def test_registry_key_format(func, ref, registry):
    entry = pfb._registry.register(func)
    m = KEY_RE.match(entry.key)
    assert m, entry.key
    assert m.group("ref") == ref
    assert registry[entry.key]() is entry
    assert pfb._registry.lookup(entry.key) is entry
    assert entry.func is func


def test_registry_keys_unique_and_weak(registry):
    entries = [pfb._registry.register(module_level_function) for _ in range(1000)]
    keys = {e.key for e in entries}
    assert len(keys) == 1000
    assert all(k in registry for k in keys)
    del entries
    collect()
    assert not keys & registry.keys()


def test_eager_calls_do_not_grow_registry(registry):
    collect()
    before = len(registry)
    for i in range(50):
        pfb.numpy_function(lambda a: a + i, [X], tf.float32)
    assert len(registry) == before


def test_tf_function_keeps_function_registered(registry):
    def kept_alive(a):
        return a * 10

    tfn = tf.function(lambda x: pfb.numpy_function(kept_alive, [x], tf.float32))
    np.testing.assert_array_equal(tfn(X).numpy(), [10, 20, 30, 40])
    keys = [k for k, ref in list(registry.items())
            if ref() is not None and ref().func is kept_alive]
    assert len(keys) == 1
    collect()
    assert keys[0] in registry
    np.testing.assert_array_equal(tfn(tf.constant([0.5, 1.5, 2.5, 3.5])).numpy(),
                                  [5, 15, 25, 35])
    collect()
    np.testing.assert_array_equal(tfn(X).numpy(), [10, 20, 30, 40])
    del tfn
    collect()
    assert keys[0] not in registry


def test_missing_key_names_the_key():
    op = pfb._library.ops().pyfunc_bridge_numpy_function
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        op(input=[X], key="tests:missing@x", Tout=[tf.float32])
    assert "tests:missing@x" in info.value.message
    assert "no Python function is registered" in info.value.message
