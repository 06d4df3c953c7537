"""TensorFlow's own py_func tests, run against TensorFlow and against pfb.

    python -m tools.tf_suite PATH/TO/py_func_test.py [--tf1] [--json OUT] [--logs DIR]

PATH is ``tensorflow/python/kernel_tests/py_func_test.py`` (or
``tensorflow/python/ops/script_ops_test.py``, or tf.data's
``tensorflow/python/data/kernel_tests/map_test.py``) of a TensorFlow 2.21
source checkout (none is in the wheel, and this project keeps no copy; the
test helpers map_test.py imports are).  A module a file imports under a name
TensorFlow has since moved (MOVED_MODULES) is aliased to its new one.
The file runs twice, each in a fresh interpreter: once as it is (TensorFlow's
result), once with TensorFlow's functions replaced by pfb's (``script_ops``'
``py_func``, ``numpy_function`` and ``eager_py_func``, and the ``tf.*`` and
``tf.compat.v1.*`` names they are exported under).  The report gives each
test's outcome on both sides (pass, fail, error, skip; ``timeout`` and
``crash`` where a test hung or killed its interpreter) and a verdict:

    equal      both sides had the same outcome
    expected   a listed difference (EXPECTED below, with its reason)
    needs PKG  a side skipped or failed for want of a package not installed
    DIFFERS    anything else

``--tf1`` runs both sides under TF1 behaviour, where the file's
``run_v1_only`` tests run.  The exit status is 1 where any test DIFFERS
(2 where a side ran no test), else 0.  This is a test tool:
it is the only code of the project that touches ``script_ops``, to patch it.
"""
import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Differences of TensorFlow's py_func_test.py (and script_ops_test.py) that are
# pfb's by design, or that come from the test reading TensorFlow's internals.
# One sentence each.
EXPECTED = {
    "EagerPyFuncTest.testTapeCache":
        "reads TensorFlow's private script_ops.tape_cache, where TF's eager py_function keeps "
        "a call's tape; pfb keeps what a call records for its gradient in a variant tensor "
        "and never touches that dict (the gradient itself: testEagerGradientTape, equal)",
}

# The names the pfb side replaces: script_ops' and their public exports.
SCRIPT_OPS_NAMES = {"py_func": "py_func", "numpy_function": "numpy_function",
                    "eager_py_func": "eager_py_func"}
TF_NAMES = {"numpy_function": "numpy_function", "py_function": "eager_py_func"}
TF_V1_NAMES = {"py_func": "py_func", "numpy_function": "numpy_function",
               "py_function": "eager_py_func"}

STATUSES = ("pass", "fail", "error", "skip", "timeout", "crash", "not run")

# Modules TensorFlow moved since a test file was written (old name -> new): the
# file imports the old name, which the children make an alias of the new.
MOVED_MODULES = {
    # map_test.py's trackable_utils (TensorFlow 2.21 has only the new module).
    "tensorflow.python.training.tracking.util": "tensorflow.python.checkpoint.checkpoint",
}


# ----- the child: runs the file's tests and writes one JSON line per event -----

class _PfbRegistrySize:
    """Stands in for TensorFlow's ``script_ops._py_funcs`` on the pfb side.

    The file's cleanup tests count the functions TensorFlow's registry holds
    (``_py_funcs.size()``); pfb's functions live in its own registry, which
    this counts instead, so those tests check pfb's lifetimes, not an idle
    registry.
    """

    def size(self):
        from pyfunc_bridge import _library
        return len(_library.conversion().registry())


def patch_with_pfb():
    """Replaces TensorFlow's functions by pfb's, where tests can reach them."""
    import tensorflow as tf
    from tensorflow.python.ops import script_ops

    import pyfunc_bridge as pfb
    for name, ours in SCRIPT_OPS_NAMES.items():
        setattr(script_ops, name, getattr(pfb, ours))
    for name, ours in TF_NAMES.items():
        setattr(tf, name, getattr(pfb, ours))
    for name, ours in TF_V1_NAMES.items():
        setattr(tf.compat.v1, name, getattr(pfb, ours))
    script_ops._py_funcs = _PfbRegistrySize()


def alias_moved_modules(moved=None):
    """Makes each old name of `moved` (default MOVED_MODULES) that no longer
    imports an alias of its new module, so that the file loads as written.

    A missing parent package becomes an empty package; a name that still
    imports is left alone."""
    for old, new in (MOVED_MODULES if moved is None else moved).items():
        try:
            importlib.import_module(old)
            continue
        except ModuleNotFoundError:
            pass
        parts = old.split(".")
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                package = types.ModuleType(name)
                package.__path__ = []
                sys.modules[name] = package
                if i > 1:
                    setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], package)
        module = importlib.import_module(new)
        sys.modules[old] = module
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)


def missing_package(exc):
    """The package whose absence `exc` (or an exception it chains) reports, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def _message(err):
    exc_type, exc, _ = err
    lines = str(exc).strip().splitlines()
    return f"{exc_type.__name__}: {lines[0] if lines else ''}"[:240]


class _Recorder(unittest.TestResult):
    """Writes each test's start and outcome to `out` as it happens."""

    def __init__(self, out, prefix):
        super().__init__()
        self._out, self._prefix, self._current = out, prefix, None

    def _id(self, test):
        test_id = test.id()
        return test_id[len(self._prefix):] if test_id.startswith(self._prefix) else test_id

    def _write(self, **event):
        self._out.write(json.dumps(event) + "\n")
        self._out.flush()

    def startTest(self, test):
        super().startTest(test)
        self._current = {"status": "pass", "message": "", "missing": None}
        self._write(event="start", test=self._id(test), t=time.time())

    def _set(self, status, err=None, reason=""):
        rank = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
        if rank[status] >= rank[self._current["status"]]:
            self._current["status"] = status
            self._current["message"] = _message(err) if err else reason
            if err is not None:
                self._current["missing"] = missing_package(err[1])

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(test, unittest.TestCase):
            self._set("error", err)
        else:  # a class or module fixture (_ErrorHolder): report it on its own
            self._write(event="end", test=str(test), status="error", message=_message(err),
                        missing=missing_package(err[1]))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set("fail", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set("skip", reason=str(reason)[:240])

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._set("fail" if issubclass(err[0], test.failureException) else "error", err)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set("fail", reason="unexpected success")

    def stopTest(self, test):
        super().stopTest(test)
        self._write(event="end", test=self._id(test), **self._current)


def _tests(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _tests(item)
        else:
            yield item


def run_child(side, path, out_path, exclude, tf1=False):
    """Runs the tests of the file at `path`, but `exclude`, on `side` ("tf" or "pfb"),
    under TF1 behaviour where `tf1`."""
    with open(out_path, "a", encoding="utf-8") as out:
        name = "tf_suite_target"
        try:
            # The public package, on both sides: it turns on TF2 behaviour, which
            # the pfb side's `import pyfunc_bridge` would otherwise bring alone.
            import tensorflow
            if tf1:
                tensorflow.compat.v1.disable_v2_behavior()
            from absl import flags
            flags.FLAGS(sys.argv[:1], known_only=True)  # test_util reads flags
            alias_moved_modules()
            if side == "pfb":
                patch_with_pfb()
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 (reported, then the child ends)
            out.write(json.dumps({"event": "end", "test": "<module>", "status": "error",
                                  "message": f"{type(exc).__name__}: {exc}"[:240],
                                  "missing": missing_package(exc)}) + "\n")
            traceback.print_exc()
            return
        tests = [t for t in _tests(unittest.defaultTestLoader.loadTestsFromModule(module))
                 if t.id()[len(name) + 1:] not in exclude]
        # One suite, so that unittest runs class fixtures (setUpClass) as usual.
        unittest.TestSuite(tests).run(_Recorder(out, name + "."))
        out.write(json.dumps({"event": "done"}) + "\n")


# ----- the parent: runs each side, restarting a child past a hung or fatal test -----

def read_events(path):
    """The complete JSON lines of `path` (a line still being written is left out)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    events = []
    for line in text.split("\n")[:-1]:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events


def results_from_events(events):
    """{test: {status, message, missing}} from a child's events, and whether it
    finished; a test started and not ended is returned under "started"."""
    results, started, done = {}, None, False
    for event in events:
        if event["event"] == "start":
            started = event
        elif event["event"] == "end":
            results[event["test"]] = {k: event.get(k) for k in ("status", "message", "missing")}
            if started and started["test"] == event["test"]:
                started = None
        elif event["event"] == "done":
            done = True
    return results, started, done


def run_side(side, path, workdir, test_timeout, log, tf1=False):
    """Runs one side to the end; returns {test: result}."""
    results = {}
    for attempt in range(200):  # each restart passes at least one test
        out_path = os.path.join(workdir, f"{side}-{attempt}.jsonl")
        exclude = json.dumps(sorted(results))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        with open(os.path.join(workdir, f"{side}-{attempt}.log"), "w") as child_log:
            child = subprocess.Popen(
                [sys.executable, "-m", "tools.tf_suite", path, "--child", side, out_path,
                 "--exclude", exclude] + ["--tf1"] * tf1, cwd=ROOT, env=env, stdout=child_log,
                stderr=subprocess.STDOUT)
            hung = None
            while child.poll() is None:
                time.sleep(0.5)
                _, started, _ = results_from_events(read_events(out_path))
                if started and time.time() - started["t"] > test_timeout:
                    hung = started["test"]
                    child.kill()
                    child.wait()
        new, started, done = results_from_events(read_events(out_path))
        results.update(new)
        if done or (not new and started is None):
            return results
        # The child died (or was killed) in a test: record it and go on past it.
        if started is not None:
            status = "timeout" if hung else "crash"
            message = (f"no result after {test_timeout} s" if hung
                       else f"the interpreter ended (exit status {child.returncode})")
            results[started["test"]] = {"status": status, "message": message, "missing": None}
        log(f"{side}: restarting after {started['test'] if started else 'a crash'}")
    return results


def compare(tf_results, pfb_results, expected=None):
    """One row per test: (test, tf result, pfb result, verdict, note)."""
    expected = EXPECTED if expected is None else expected
    absent = {"status": "not run", "message": "", "missing": None}
    rows = []
    for test in sorted(set(tf_results) | set(pfb_results)):
        tf_r, pfb_r = tf_results.get(test, absent), pfb_results.get(test, absent)
        # A package pfb's side lacks where TensorFlow's passed is pfb's difference.
        missing = tf_r.get("missing") or (tf_r["status"] != "pass" and pfb_r.get("missing"))
        if missing:
            verdict, note = f"needs {missing}", ""
        elif tf_r["status"] == pfb_r["status"]:
            verdict, note = "equal", ""
        elif test in expected:
            verdict, note = "expected", expected[test]
        else:
            verdict = "DIFFERS"
            note = pfb_r["message"] or tf_r["message"]
        rows.append((test, tf_r, pfb_r, verdict, note))
    return rows


def summary(rows):
    """Counts of the verdicts: tests, equal, expected, needs a package, differs."""
    counts = {"tests": len(rows), "equal": 0, "expected": 0, "needs package": 0, "differs": 0}
    for _, _, _, verdict, _ in rows:
        key = ("needs package" if verdict.startswith("needs ") else
               "differs" if verdict == "DIFFERS" else verdict)
        counts[key] += 1
    return counts


def format_report(rows, expected=None):
    expected = EXPECTED if expected is None else expected
    width = max([len(r[0]) for r in rows] + [4])
    lines = [f"{'test':<{width}}  {'tf':<7}  {'pfb':<7}  verdict"]
    for test, tf_r, pfb_r, verdict, note in rows:
        line = f"{test:<{width}}  {tf_r['status']:<7}  {pfb_r['status']:<7}  {verdict}"
        lines.append(line + (f": {note}" if note else ""))
    equal_listed = [r[0] for r in rows if r[3] == "equal" and r[0] in expected]
    for test in equal_listed:
        lines.append(f"note: {test} is listed as an expected difference but was equal")
    counts = summary(rows)
    lines.append(f"{counts['tests']} tests: equal on {counts['equal']}, expected differences "
                 f"{counts['expected']}, needing a missing package {counts['needs package']}, "
                 f"differing {counts['differs']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.tf_suite",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="TensorFlow's py_func_test.py")
    parser.add_argument("--json", help="write both sides' results and the verdicts here")
    parser.add_argument("--test-timeout", type=float, default=600.0,
                        help="seconds one test may take before it is a timeout (600)")
    parser.add_argument("--logs", help="keep each child's output and events in this folder")
    parser.add_argument("--tf1", action="store_true",
                        help="run both sides under TF1 behaviour (disable_v2_behavior), "
                             "where the file's run_v1_only tests run")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--exclude", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = os.path.abspath(args.path)
    if args.child:
        side, out = args.child
        run_child(side, path, out, set(json.loads(args.exclude)), args.tf1)
        return 0
    if not os.path.isfile(path):
        parser.error(f"no file {path}")

    def log(text):
        print(text, file=sys.stderr, flush=True)

    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    with (contextlib.nullcontext(os.path.abspath(args.logs)) if args.logs
          else tempfile.TemporaryDirectory(prefix="tf_suite-")) as workdir:
        log("running the file as it is (tf) and with pfb's functions (pfb), side by side ...")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            tf_run, pfb_run = (pool.submit(run_side, side, path, workdir, args.test_timeout,
                                           log, args.tf1) for side in ("tf", "pfb"))
            tf_results, pfb_results = tf_run.result(), pfb_run.result()
    rows = compare(tf_results, pfb_results)
    print(format_report(rows))
    if not tf_results or not pfb_results:
        log("a side ran no tests: see the message above")
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"tf": tf_results, "pfb": pfb_results, "summary": summary(rows),
                       "verdicts": {r[0]: [r[3], r[4]] for r in rows}}, f, indent=1)
    return 1 if summary(rows)["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
