"""A fork while another thread holds one of pyfunc_bridge's locks: the child's
own use of pyfunc_bridge does not wait for it (the thread is not in the
child, so its hold would last for ever)."""
from process_pool_helpers import run_script

# Each case holds one lock in a parent thread (a function called under it
# blocks until the fork is done), forks, and has the child use what that
# lock guards.  The op library's case comes first: it holds the lock under
# which the first op built makes the op wrappers.
_FORK_WHILE_HELD_SCRIPT = "pool/fork_locks_fork_while_held.py"


def test_a_fork_while_a_thread_holds_a_lock_leaves_the_child_its_locks():
    run_script(_FORK_WHILE_HELD_SCRIPT)
