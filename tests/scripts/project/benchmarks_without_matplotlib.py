"""None in sys.modules makes `import matplotlib` fail as if it were missing.

Run by tests/project/test_benchmarks_without_matplotlib.py in a fresh interpreter
(tests/fresh_python.py)."""
import runpy, sys
sys.modules["matplotlib"] = None
sys.argv = ["benchmarks"] + sys.argv[1:]
runpy.run_module("benchmarks", run_name="__main__")
