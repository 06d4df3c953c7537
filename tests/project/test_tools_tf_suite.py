"""tools/tf_suite.py's own logic: reading a child's events, the verdicts, the
exit status, and a run end to end on a small file of our own (not TF's)."""
import json
import os
import sys
import textwrap

import pytest

from conftest import ROOT
from fresh_python import fresh_python
from tools import tf_suite


def result(status, message="", missing=None):
    return {"status": status, "message": message, "missing": missing}


def test_events_give_results_and_the_test_left_unfinished(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(
        json.dumps({"event": "start", "test": "A.testOne", "t": 1.0}) + "\n"
        + json.dumps({"event": "end", "test": "A.testOne", "status": "pass", "message": "",
                      "missing": None}) + "\n"
        + json.dumps({"event": "start", "test": "A.testTwo", "t": 2.0}) + "\n"
        + '{"event": "end", "te')  # a line still being written when the child died
    results, started, done = tf_suite.results_from_events(tf_suite.read_events(path))
    assert results == {"A.testOne": result("pass")}
    assert started["test"] == "A.testTwo"
    assert not done


def test_verdicts():
    tf_side = {"A.same": result("pass"), "A.listed": result("pass"),
               "A.other": result("pass"), "A.pkg": result("skip"),
               "A.only_tf": result("fail"), "A.pkg_pfb": result("pass")}
    pfb_side = {"A.same": result("pass"), "A.listed": result("fail", "AssertionError: x"),
                "A.other": result("error", "TypeError: y"),
                "A.pkg": result("error", "ModuleNotFoundError: z", missing="scipy"),
                "A.pkg_pfb": result("error", "ModuleNotFoundError: z", missing="scipy")}
    rows = tf_suite.compare(tf_side, pfb_side, expected={"A.listed": "by design"})
    verdicts = {test: (verdict, note) for test, _, _, verdict, note in rows}
    assert verdicts == {
        "A.same": ("equal", ""),
        "A.listed": ("expected", "by design"),
        "A.other": ("DIFFERS", "TypeError: y"),
        "A.pkg": ("needs scipy", ""),
        "A.only_tf": ("DIFFERS", ""),  # pfb's side never ran it: "not run"
        "A.pkg_pfb": ("DIFFERS", "ModuleNotFoundError: z"),  # TF's side did without it
    }
    assert tf_suite.summary(rows) == {"tests": 6, "equal": 1, "expected": 1,
                                      "needs package": 1, "differs": 3}
    report = tf_suite.format_report(rows, expected={"A.listed": "by design", "A.same": "old"})
    assert "A.same is listed as an expected difference but was equal" in report
    assert report.splitlines()[-1] == ("6 tests: equal on 1, expected differences 1, needing "
                                       "a missing package 1, differing 3")


def test_missing_package_follows_the_chain():
    try:
        try:
            import pfb_no_such_package.sub  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as exc:
        assert tf_suite.missing_package(exc) == "pfb_no_such_package"
    assert tf_suite.missing_package(ValueError("x")) is None


def test_moved_modules_import_under_their_old_names():
    import json as new_module
    moved = {"pfb_moved_pkg.old.mod": "json", "textwrap": "json"}
    try:
        tf_suite.alias_moved_modules(moved)
        from pfb_moved_pkg.old import mod
        import pfb_moved_pkg.old.mod as mod_again
        assert mod is mod_again is new_module
        assert sys.modules["textwrap"] is textwrap  # it still imports: left alone
    finally:
        for name in ("pfb_moved_pkg", "pfb_moved_pkg.old", "pfb_moved_pkg.old.mod"):
            sys.modules.pop(name, None)


SUITE = textwrap.dedent('''
    import os
    import unittest

    import numpy as np
    from tensorflow.python.framework import dtypes
    from tensorflow.python.ops import script_ops


    class T(unittest.TestCase):

        def testSame(self):
            y = script_ops.py_func(lambda x: x + 1, [np.float32(1)], dtypes.float32)
            self.assertEqual(float(y), 2.0)

        def testWhichSide(self):
            # Fails on pfb's side only: the patched function is pfb's.
            self.assertEqual(script_ops.py_func.__module__.split(".")[0], "tensorflow")

        def testNeedsPackage(self):
            import pfb_no_such_package  # noqa: F401

        def testSkipped(self):
            self.skipTest("not here")

        def testDiesOnPfb(self):
            if script_ops.py_func.__module__.startswith("pyfunc_bridge"):
                os._exit(3)
''')


@pytest.mark.slow
def test_a_small_suite_end_to_end(tmp_path):
    path = tmp_path / "small_test.py"
    path.write_text(SUITE)
    out = tmp_path / "out.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = fresh_python("-m tools.tf_suite", path, "--json", out, cwd=ROOT, env=env,
                        timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = json.loads(out.read_text())["verdicts"]
    assert {test: v[0] for test, v in verdicts.items()} == {
        "T.testSame": "equal", "T.testSkipped": "equal", "T.testWhichSide": "DIFFERS",
        "T.testNeedsPackage": "needs pfb_no_such_package", "T.testDiesOnPfb": "DIFFERS"}
    results = json.loads(out.read_text())
    assert results["pfb"]["T.testDiesOnPfb"]["status"] == "crash"
    assert results["tf"]["T.testDiesOnPfb"]["status"] == "pass"
