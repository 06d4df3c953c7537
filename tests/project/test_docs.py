"""The docstring examples run and say what they show."""
import doctest
import importlib

import pytest

MODULES = ["pyfunc_bridge", "pyfunc_bridge._numpy_function", "pyfunc_bridge._py_function",
           "pyfunc_bridge._tout", "pyfunc_bridge._stats", "pyfunc_bridge._conversion",
           "pyfunc_bridge._array_function", "pyfunc_bridge._portable", "pyfunc_bridge.pool.process_pool",
           "pyfunc_bridge._pool", "pyfunc_bridge._errors", "pyfunc_bridge.pool.errors",
           "pyfunc_bridge._frameworks"]
# Modules whose examples use an optional framework.
NEEDS = {"pyfunc_bridge._array_function": "torch"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
