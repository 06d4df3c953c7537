"""`python -m benchmarks` without matplotlib: it says so at the start, runs
every selected scenario, writes the table and results.json, and names the
extra that brings the plot."""
import json
import subprocess
import sys
import textwrap

from conftest import ROOT, script_env

# None in sys.modules makes `import matplotlib` fail as if it were missing.
RUN_WITHOUT_MATPLOTLIB = textwrap.dedent("""
    import runpy, sys
    sys.modules["matplotlib"] = None
    sys.argv = ["benchmarks"] + sys.argv[1:]
    runpy.run_module("benchmarks", run_name="__main__")
""")


def test_run_without_matplotlib_writes_table_and_json(tmp_path):
    env = script_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_MATPLOTLIB, "--smoke", "--only", "graph_overhead",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    # Said before the first scenario runs, and again with the summary.
    note = run.stderr.index("needs matplotlib")
    assert note < run.stderr.index("[1/1] graph_overhead ...")
    assert 'pip install -e ".[cpu,bench]"' in run.stderr
    assert "numpy_function identity" in run.stdout  # the table
    assert "needs matplotlib" in run.stdout and "bench extra" in run.stdout
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert set(results) == {"graph_overhead", "meta"}
    assert not (tmp_path / "benchmark.png").exists()
