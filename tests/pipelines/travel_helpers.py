"""What the test_travel_*.py files share: fresh interpreters that see this
checkout and the helper modules, pickles untrusted unless a test says so,
and the input their functions get."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from conftest import ROOT, TESTS, script_env

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
    """Runs `script` in a fresh interpreter (killed after TIMEOUT); returns
    the JSON object it prints last."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          env=env or fresh_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
