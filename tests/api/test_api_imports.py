"""The op layer's imports run one way: the module import graph of
pyfunc_bridge/ has no cycle (docs/design.md, "Where things are").

Read from the source with ast, so that an import inside a function (run
late, but still an arrow between modules) counts like one at the top."""
import ast
import os

import pyfunc_bridge

PACKAGE = "pyfunc_bridge"
PACKAGE_DIR = os.path.dirname(pyfunc_bridge.__file__)


def _modules(directory=PACKAGE_DIR):
    return sorted(name[:-3] for name in os.listdir(directory) if name.endswith(".py"))


def _imported(node, modules):
    """The package's modules that an Import / ImportFrom node names."""
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == PACKAGE:
                found.append(parts[1] if len(parts) > 1 else "__init__")
        return found
    if node.level:  # relative: from . import x, from ._x import y
        dotted = ".".join([PACKAGE] + ([node.module] if node.module else []))
    else:
        dotted = node.module or ""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return []
    if len(parts) > 1:
        return [parts[1]]
    # from pyfunc_bridge import a, b: a submodule, or a name of __init__.
    return [alias.name if alias.name in modules else "__init__" for alias in node.names]


def import_graph(directory=PACKAGE_DIR):
    """module -> the package's modules it imports (anywhere in its source)."""
    modules = set(_modules(directory))
    graph = {}
    for module in sorted(modules):
        with open(os.path.join(directory, module + ".py")) as f:
            tree = ast.parse(f.read())
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(node, modules))
        # Compiled modules (_conversion) and generated ones are not sources here.
        graph[module] = sorted((edges & modules) - {module})
    return graph


def find_cycle(graph):
    """One cycle of `graph` as a list of modules (first = last), or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        path.append(module)
        for child in graph.get(module, ()):
            if state.get(child) == "open":
                return path[path.index(child):] + [child]
            if child not in state:
                cycle = visit(child, path)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            if cycle:
                return cycle
    return None


def test_the_graph_is_read_from_every_module():
    graph = import_graph()
    assert set(graph) == set(_modules())
    # Arrows the layering names (so that an empty graph cannot pass).
    assert "_portable" in graph["_op"]
    assert "_numpy_function" in graph["__init__"]
    assert "_py_function" in graph["_resolve"]


def test_the_module_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_function_level_imports_count(tmp_path):
    (tmp_path / "a.py").write_text("from pyfunc_bridge import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from pyfunc_bridge.a import g\n")
    (tmp_path / "c.py").write_text("import pyfunc_bridge\nfrom . import a\n")
    (tmp_path / "__init__.py").write_text("from pyfunc_bridge.b import f\n")
    graph = import_graph(str(tmp_path))
    assert graph == {"a": ["b"], "b": ["a"], "c": ["__init__", "a"], "__init__": ["b"]}
    assert find_cycle(graph) in (["a", "b", "a"], ["b", "a", "b"])
