"""Fresh interpreters for tests, started one way: a script of tests/scripts/
(or code, for a line or two, or a module with -m) with a timeout, and the
process killed by its pid whatever ends the wait (a hang, a failed check, a
Ctrl-C), so that no test leaves one behind.

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


def command(script, *args, prefix=()):
    """The argv of `script`: a file of tests/scripts/ by its name there
    (ending in .py), a module as "-m name", or else code for ``python -c``;
    after `prefix`, a program that runs the interpreter (``unshare -rn``)."""
    if script.endswith(".py") and "\n" not in script:
        return [*prefix, sys.executable, script_path(script), *map(str, args)]
    if script.startswith("-m ") and len(script.split()) == 2:
        return [*prefix, sys.executable, "-m", script.split()[1], *map(str, args)]
    return [*prefix, sys.executable, "-c", script, *map(str, args)]


def _kill(proc):
    """SIGKILL to `proc` (unreaped: its pid is still its own), or to its
    process group where it leads one (started with start_new_session=True),
    which takes the children it started too."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def started_python(script, *args, env=None, cwd=TESTS, prefix=(), **popen):
    """A fresh interpreter running `script` (see command) as a Popen, for a
    test that talks to it or signals it; killed by its pid on leaving the
    block if it still runs, and reaped.  `env`: the environment (default:
    script_env with the checkout and this folder on the path).
    ``start_new_session=True`` kills its process group instead, children
    included."""
    proc = subprocess.Popen(command(script, *args, prefix=prefix), cwd=cwd,
                            env=script_env(ROOT, TESTS) if env is None else env, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            _kill(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def fresh_python(script, *args, timeout=TIMEOUT, env=None, cwd=TESTS, input=None, prefix=(),
                 start_new_session=False):
    """Runs `script` (see command) with `args` in a fresh interpreter and
    returns its CompletedProcess (stdout and stderr as text).  A run past
    `timeout` seconds is killed and fails the test with its stderr.
    `prefix` and `start_new_session`: see command and started_python."""
    with started_python(script, *args, env=env, cwd=cwd, text=True, prefix=prefix,
                        start_new_session=start_new_session,
                        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{script if script.endswith('.py') else 'the script'} ran "
                                 f"past {timeout} s and was killed; its stderr:\n"
                                 f"{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
