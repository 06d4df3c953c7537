"""Each case holds one lock in a parent thread (a function called under it
blocks until the fork is done), forks, and has the child use what that lock
guards.  The op library's case comes first: it holds the lock under which
the first op built makes the op wrappers.

Run by tests/pool/test_process_pool_fork_locks.py in a fresh interpreter
(tests/fresh_python.py)."""
import itertools, os, threading
import numpy as np, tensorflow as tf, pyfunc_bridge as pfb
from pool_checks import child_exit_code
from pyfunc_bridge import _resolve
from pyfunc_bridge.pool import process_pool, statistics
from pyfunc_bridge.pool.answers import ring_answers

held, forked = threading.Event(), threading.Event()

def held_once(function):
    # `function`, whose first call (under the lock) lasts until the fork is done.
    calls = itertools.count()
    def holding(*args, **kwargs):
        if next(calls) == 0:
            held.set()
            forked.wait(120)
        return function(*args, **kwargs)
    return holding

def negated(x, executor=None):
    y = pfb.numpy_function(np.negative, [tf.constant(x)], tf.float32, executor=executor)
    assert float(y) == -x

def big(pool):  # a result larger than the pool's arena comes by its worker's socket
    # (not tf.ones, which fills a large tensor on TensorFlow's threads: none in a child)
    x = tf.constant(np.ones(1 << 18, np.float32))
    y = pfb.numpy_function(np.negative, [x], tf.float32, executor=pool)
    assert float(y[-1]) == -1.0

def small_pool(name):
    return pfb.ProcessPool(1, name=name, arena_bytes=0)

def hold_library():
    tf.load_op_library = held_once(tf.load_op_library)
    return lambda: negated(1.0), lambda: negated(2.0)

def hold_records():
    # (A record is made under the records' lock, by the defaultdict's factory.)
    statistics._records.default_factory = held_once(statistics._records.default_factory)
    return lambda: pfb.ProcessPool(1, name="held").close(), lambda: negated(2.0, "process")

def hold_a_record():
    negated(1.0, "process")  # the default pool's record has a route
    statistics._add_route_counts = held_once(statistics._add_route_counts)
    return pfb.stats, lambda: negated(2.0, "process")

def hold_answers():
    pool = small_pool("small")
    ring_answers._arrived.notify_all = held_once(ring_answers._arrived.notify_all)
    return lambda: (big(pool), pool.close()), lambda: big(small_pool("small in the child"))

def hold_resolution():
    _resolve._function = held_once(lambda *description: np.negative)
    resolve = lambda: _resolve.resolve("forked key", "", b"", None, False, 1)
    return resolve, lambda: resolve().func is np.negative or os._exit(3)

def hold_default_pool():
    process_pool.default_pool().close()
    process_pool.Functions = held_once(process_pool.Functions)  # (in ProcessPool())
    return lambda: negated(1.0, "process"), lambda: negated(2.0, "process")

hung = []
for case in (hold_library, hold_records, hold_a_record, hold_answers, hold_resolution,
             hold_default_pool):
    held.clear()
    forked.clear()
    holder, use = case()
    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(120), f"{case.__name__}: the lock was never held"
    child = os.fork()
    if child == 0:
        use()
        os._exit(0)  # (TensorFlow's own exit hangs in a fork of a process that ran ops)
    try:
        code = child_exit_code(child, case.__name__)
    except AssertionError:  # (killed after its 60 s)
        hung.append(case.__name__)
    else:
        assert code == 0, (case.__name__, code)
    forked.set()
    thread.join(120)
assert not hung, f"the child waited for a lock its parent's thread held: {hung}"
print("done")
