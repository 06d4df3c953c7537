"""Signatures from pyfunc_bridge/__init__.pyi for the API reference.

The stub is the public API's typed surface (executor= included), so autodoc
shows its parameters and annotations instead of the implementations': the
stub's private aliases (``_Tout``, ``_Executor``, ...) are written out, the
defaults are the running functions' (the stub says ``...``), and overloads
(the decorator form and the call form) merge into one signature.  A class's
members are those the stub declares.
"""
import ast
import inspect
import pathlib

import pyfunc_bridge

STUB = pathlib.Path(pyfunc_bridge.__file__).with_name("__init__.pyi")
PREFIX = "pyfunc_bridge."


class _Expand(ast.NodeTransformer):
    """Replaces the stub's private aliases by what they stand for."""

    def __init__(self, aliases):
        self.aliases = aliases

    def visit_Name(self, node):
        if node.id in self.aliases:
            return self.visit(self.aliases[node.id])
        return node


def _parts(annotation):
    """The members of a union annotation, as source text."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _parts(annotation.left) + _parts(annotation.right)
    return [ast.unparse(annotation)]


def _union(annotations):
    parts = []
    for annotation in annotations:
        for part in _parts(annotation):
            if part not in parts:
                parts.append(part)
    if "Any" in parts:
        return "Any"
    return " | ".join([p for p in parts if p != "None"] + (["None"] if "None" in parts else []))


def read_stub(path=STUB):
    """name -> list of FunctionDef (overloads) for the stub's functions, and
    ``Class.method`` for its classes' methods (``Class`` for ``__init__``)."""
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("_")):
            aliases[node.targets[0].id] = node.value
    expand = _Expand(aliases)
    functions, names = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions.setdefault(node.name, []).append(expand.visit(node))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    key = node.name if item.name == "__init__" else f"{node.name}.{item.name}"
                    functions.setdefault(key, []).append(expand.visit(item))
                    names.setdefault(node.name, set()).add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    names.setdefault(node.name, set()).add(item.target.id)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
              and node.value.id in functions):
            for target in node.targets:  # eager_py_func = py_function
                functions[target.id] = functions[node.value.id]
    return functions, names


def signature(overloads, runtime):
    """One signature string for the stub's `overloads` of a function, with the
    defaults of `runtime` (an inspect.Signature or None)."""
    args = overloads[0].args
    positional = [a.arg for a in args.posonlyargs + args.args if a.arg != "self"]
    keyword = [a.arg for a in args.kwonlyargs]
    annotations = {}
    for overload in overloads:
        o = overload.args
        for a in o.posonlyargs + o.args + o.kwonlyargs:
            if a.annotation is not None:
                annotations.setdefault(a.arg, []).append(a.annotation)
    params = runtime.parameters if runtime is not None else {}

    def text(name):
        out = name
        if name in annotations:
            out += f": {_union(annotations[name])}"
        param = params.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            out += f" = {param.default!r}"
        return out

    pieces = [text(n) for n in positional]
    if keyword:
        pieces += ["*"] + [text(n) for n in keyword]
    returns = [o.returns for o in overloads if o.returns is not None]
    return f"({', '.join(pieces)})", (_union(returns) if returns else "")


def setup(app):
    functions, members = read_stub()

    def process_signature(app, what, name, obj, options, args, retann):
        if what == "property" or not name.startswith(PREFIX):
            return None  # (a property's signature is its return type alone)
        key = name[len(PREFIX):]
        if key not in functions:
            return None
        try:
            runtime = inspect.signature(obj)
        except (TypeError, ValueError):
            runtime = None
        return signature(functions[key], runtime)

    def skip_member(app, what, name, obj, skip, options):
        # A class of the stub shows the members the stub declares, and no other.
        target = getattr(obj, "fget", obj)
        cls = getattr(target, "__qualname__", "").rpartition(".")[0]
        if what == "class" and cls in members:
            return name not in members[cls]
        return None

    app.connect("autodoc-process-signature", process_signature)
    app.connect("autodoc-skip-member", skip_member)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
