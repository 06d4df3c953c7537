"""Calls under TensorFlow's async eager execution
(`tf.config.experimental.set_synchronous_execution(False)`): an async
executor runs ops on a thread of its own, so a function that ran there and
waited for its own TF ops (queued behind it) or for a lock its caller holds
would wait for ever.  Each mode runs in a fresh interpreter (the mode is
per process, and a hang must end in the timeout)."""
import json

import pytest

from conftest import ROOT, script_env
from fresh_python import fresh_python

# Prints one JSON line: what each call returned.  "start": async before the
# context exists (every thread's default executor is async); "after": async
# set once it exists (only the main thread's executor is).
_SCRIPT = "kernel/async_eager.py"


@pytest.mark.parametrize("made_async", ["start", "after"])
def test_async_eager_calls_finish_with_the_values_of_sync_ones(made_async):
    proc = fresh_python(_SCRIPT, made_async, timeout=120, cwd=ROOT, env=script_env(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "numpy_function with TF ops": 2,
        "numpy_function on the caller's thread": 1,
        "numpy_function, caller holds an RLock": 2,
        "py_function": 2,
        "py_function in tf.function": 2,
        "py_function gradient": 6.0,
    }
