"""Fresh interpreters for tests, started one way: a script of tests/scripts/
(or code, for a line or two) with a timeout, and the process killed by its
pid whatever ends the wait (a hang, a failed check, a Ctrl-C), so that no
test leaves one behind.

Scripts are found from this folder, never from the package: the wheel CI
leg (tools/test_wheel.sh) runs these tests from a copy of the checkout
against the installed package."""
import contextlib
import os
import signal
import subprocess
import sys

from conftest import ROOT, TESTS, script_env

SCRIPTS = os.path.join(TESTS, "scripts")
# Only a hang's bound: a script of a few seconds took a minute on a machine
# loaded four times over (TensorFlow's import and the workers' start alone).
TIMEOUT = 600


def script_path(script):
    """tests/scripts/`script` (a path below it, "pool/fork_broken.py")."""
    path = os.path.join(SCRIPTS, script)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no script {script!r} in {SCRIPTS}")
    return path


def command(script, *args):
    """The argv of `script`: a file of tests/scripts/ by its name there
    (ending in .py), or else code for ``python -c``."""
    if script.endswith(".py") and "\n" not in script:
        return [sys.executable, script_path(script), *map(str, args)]
    return [sys.executable, "-c", script, *map(str, args)]


@contextlib.contextmanager
def started_python(script, *args, env=None, cwd=TESTS, **popen):
    """A fresh interpreter running `script` (see command) as a Popen, for a
    test that talks to it or signals it; killed by its pid on leaving the
    block if it still runs, and reaped.  `env`: the environment (default:
    script_env with the checkout and this folder on the path)."""
    proc = subprocess.Popen(command(script, *args), cwd=cwd,
                            env=script_env(ROOT, TESTS) if env is None else env, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)  # unreaped: the pid is still this one
            except ProcessLookupError:
                pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def fresh_python(script, *args, timeout=TIMEOUT, env=None, cwd=TESTS, input=None):
    """Runs `script` (see command) with `args` in a fresh interpreter and
    returns its CompletedProcess (stdout and stderr as text).  A run past
    `timeout` seconds is killed and fails the test with its stderr."""
    with started_python(script, *args, env=env, cwd=cwd, text=True,
                        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{script if script.endswith('.py') else 'the script'} ran "
                                 f"past {timeout} s and was killed; its stderr:\n"
                                 f"{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
