"""What the documentation's examples need around them: a scratch folder with
the files and the importable package (``mypackage``) they name.  The doctest
builder imports it in every page's setup (conf.py: doctest_global_setup)."""
import atexit
import os
import shutil
import sys
import tempfile

SCRATCH = tempfile.mkdtemp(prefix="pfb-docs-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)

_PREPROCESS = '''import pyfunc_bridge as pfb


@pfb.portable
def scale(a):
    return a * 2
'''


def _package():
    package = os.path.join(SCRATCH, "mypackage")
    os.makedirs(package, exist_ok=True)
    open(os.path.join(package, "__init__.py"), "w").close()
    with open(os.path.join(package, "preprocess.py"), "w") as f:
        f.write(_PREPROCESS)
    if SCRATCH not in sys.path:
        sys.path.insert(0, SCRATCH)  # pool workers take this process's sys.path


_package()


def text_files():
    """Two small CSV-like text files of integers, one line each."""
    names = []
    for i, line in enumerate(["1,2,3", "4,5,6"]):
        name = os.path.join(SCRATCH, f"lines-{i}.txt")
        with open(name, "w") as f:
            f.write(line + "\n")
        names.append(name)
    return names


def scratch(name):
    """A path in the scratch folder."""
    return os.path.join(SCRATCH, name)


def docstring_globals(name):
    """The globals a docstring's examples run with under pytest's doctest
    (tests/project/test_docs.py): those of the module that defines `name`."""
    import importlib
    import pyfunc_bridge
    obj, parts = pyfunc_bridge, name.split(".")[1:]
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(["pyfunc_bridge", *parts[:i + 1]]))
    module = getattr(obj, "__module__", None) or obj.__name__
    return dict(vars(sys.modules[module]))

# Examples that need a running tf.data service skip: its servers listen on every
# interface, which the tests allow only in a private network namespace.
SERVICE = False
