"""The docstring examples run and say what they show."""
import doctest
import importlib

import pytest

MODULES = ["pyfunc_bridge", "pyfunc_bridge._numpy_function", "pyfunc_bridge._tout",
           "pyfunc_bridge._stats",
           "pyfunc_bridge._conversion"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
