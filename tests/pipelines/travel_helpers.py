"""What the test_travel_*.py files share: fresh interpreters that see this
checkout and the helper modules, pickles untrusted unless a test says so,
and the input their functions get."""
import json
import os

import numpy as np

from conftest import ROOT, TESTS, script_env
from fresh_python import fresh_python

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 240  # seconds per subprocess, on a busy machine
X = np.array([1.0, 2.0, 3.0], np.float32)


def fresh_env(**extra):
    """The environment of a fresh process: this checkout, tests/ (its helper
    modules) and this file's folder on the path, pickles untrusted unless
    `extra` says otherwise."""
    env = script_env(ROOT, TESTS, HERE, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PFB_TRUST_PICKLED", None)
    env.update(extra)
    return env


def run_python(script, *args, env=None):
    """Runs tests/scripts/`script` in a fresh interpreter (killed after
    TIMEOUT); returns the JSON object it prints last."""
    proc = fresh_python(script, *args, env=env or fresh_env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
