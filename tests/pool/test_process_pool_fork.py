"""Process workers across fork(): the child gets a clear error for its
parent's pool and lets go of its shared memory, and the parent's pool goes on
with the same workers."""
import json

from fresh_python import fresh_python
from pool_checks import worker_alive
from process_pool_helpers import run_script
from process_pool_helpers import failing_start  # noqa: F401 (fixtures)


# A fork of a process that has pools: the child gets a clear error for the
# parent's pool and a fresh default pool, runs its exit hooks, and the
# parent's pools go on with the same workers.
_FORK_SCRIPT = "pool/fork.py"


def test_a_forked_child_gets_a_clear_error_and_the_parent_pool_is_unaffected():
    run = fresh_python(_FORK_SCRIPT, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "child hung" not in run.stdout  # on the parent's pool
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    child = json.loads(lines["child"])
    parent = json.loads(lines["parent"])
    for how, error in (("api", child["api"]), ("run", child["run"])):
        assert "'forked pool'" in error or "forked pool " in error, (how, error)
        assert "is a fork of it" in error and "Start a ProcessPool in this process" in error
    assert child["api"].startswith("PoolClosedError[FailedPreconditionError]")  # (eager)
    assert child["run"].startswith("PoolClosedError")
    # The child's default pool is its own; the parent's workers are the same ones.
    assert child["default"] in child["default_pids"]
    assert not set(child["default_pids"]) & set(parent["before"]["default"])
    # The same workers, and each call ran in one of its pool's (which of the
    # default pool's two takes a call is the pool's choice).
    for state in (parent["before"], parent["after"]):
        assert state["calls"][0] in state["pool"] and state["calls"][1] in state["default"]
    assert {k: parent["after"][k] for k in ("pool", "default")} == \
        {k: parent["before"][k] for k in ("pool", "default")}
    assert not [p for p in child["default_pids"] if worker_alive(p)]  # ended at the child's exit


# A forked child lets go of its parent's pools' shared memory: it holds no
# descriptor of their memfds and maps none of them (their mappings are its
# own memory now), the result tensors it inherited (from the Python path
# and from a kernel's native route) keep their values while the parent
# lets go of their blocks and the worker reuses them, and using the pool
# there is a clear error.
_FORK_KEEPS_RESULT_SCRIPT = "pool/fork_keeps_result.py"


def test_a_forked_child_lets_go_of_the_pool_s_memory_and_keeps_its_results():
    run_script(_FORK_KEEPS_RESULT_SCRIPT)


# A fork of a process whose pool holds a dead worker (a broken pool: its
# workers exit as they start): the child closes only descriptors the pool
# still owns.  The dead worker's socket was closed in the parent, and its
# number may by then be another file's, which the child must keep.
_FORK_BROKEN_SCRIPT = "pool/fork_broken.py"


def test_a_forked_child_closes_only_descriptors_its_parent_s_pool_owns(failing_start):
    run_script(_FORK_BROKEN_SCRIPT, failing_start)


# A fork while a worker starts (its start, on the spawning thread, is held
# just before the worker's process runs, when its socket ends and doorbell
# exist): the child holds none of them.  A fork waits for a start to give its
# worker to the pool, so the start is held only until the fork returns, or
# for a few seconds where the fork waits for it.
_FORK_DURING_START_SCRIPT = "pool/fork_during_start.py"

_CTRL_C_WHILE_A_FORK_WAITS_SCRIPT = "pool/fork_ctrl_c_while_a_fork_waits.py"


def test_a_fork_while_a_worker_starts_leaves_the_child_none_of_its_descriptors():
    run_script(_FORK_DURING_START_SCRIPT)


def test_a_ctrl_c_while_a_fork_waits_for_a_start_comes_after_the_fork():
    # A fork hook cannot raise: the wait goes on, and the Ctrl-C is raised
    # once the fork is done (before, it skipped the wait and left the child
    # the starting worker's descriptors).
    run_script(_CTRL_C_WHILE_A_FORK_WAITS_SCRIPT)


_FORK_WHILE_PICKLING_SCRIPT = "pool/fork_while_pickling.py"


def test_a_fork_while_a_function_pickles_leaves_the_child_able_to_pickle():
    run_script(_FORK_WHILE_PICKLING_SCRIPT)


# A fork while a TF thread of the parent is inside a bridge call (an
# in-process numpy_function in a tf.function): that call is not in the child,
# and the child's exit (sys.exit after a pool call) does not wait for it
# (it waited 10 s, the bound of its wait for the calls under way).
_EXIT_AFTER_A_FORK_SCRIPT = "pool/fork_exit_after_a_fork.py"


def test_a_forked_child_s_exit_does_not_wait_for_its_parent_s_calls():
    run_script(_EXIT_AFTER_A_FORK_SCRIPT)
