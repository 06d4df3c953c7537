"""A pool call flows down and back up (docs/pool.md, "Where a call goes"):
the pool's Python side (pyfunc_bridge/pool/, pyfunc_bridge/worker/) never
calls up into the conversion layer, which calls it.  What the pool needs of
that layer (the trace clock, the view of a result block) is passed down as
arguments by src/conversion/process.pxi.

Read from the source with ast, so that an import inside a function counts."""
import ast
import os

import pyfunc_bridge

PACKAGE_DIR = os.path.dirname(pyfunc_bridge.__file__)


def _reaches_library(path):
    """Whether the module imports pyfunc_bridge._library (the accessor of the
    compiled conversion module) anywhere."""
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pyfunc_bridge":
            if any(alias.name == "_library" for alias in node.names):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            if any(name.startswith("pyfunc_bridge._library") for name in names):
                return True
    return False


def test_the_pool_does_not_call_up_into_the_conversion_layer():
    checked, upward = 0, []
    for package in ("pool", "worker"):
        directory = os.path.join(PACKAGE_DIR, package)
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                checked += 1
                if _reaches_library(os.path.join(directory, name)):
                    upward.append(f"{package}/{name}")
    assert checked > 10  # (the directories were found)
    assert upward == [], f"modules that call up into the conversion layer: {upward}"

