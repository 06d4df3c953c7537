"""`python -m benchmarks` without matplotlib: it says so at the start, runs
every selected scenario, writes the table and results.json, and names the
extra that brings the plot."""
import json

from conftest import ROOT, script_env
from fresh_python import fresh_python

# None in sys.modules makes `import matplotlib` fail as if it were missing.
RUN_WITHOUT_MATPLOTLIB = "project/benchmarks_without_matplotlib.py"


def test_run_without_matplotlib_writes_table_and_json(tmp_path):
    env = script_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    run = fresh_python(RUN_WITHOUT_MATPLOTLIB, "--smoke", "--only", "graph_overhead",
                       "--out", tmp_path, cwd=ROOT, timeout=300, env=env)
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
