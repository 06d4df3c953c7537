"""The process pool: ``ProcessPool`` and ``executor=`` (docs/pool.md).

Nothing is imported here, so that a part loads without the rest; the facade
is ``process_pool``, which imports the parts, and none of them imports it:

* ``process_pool``: ProcessPool, the default pool, executor=, exit and fork;
* ``supervision``: workers' reader threads, death, replacement, back-off,
  close, and a forked child's view of its parent's pools;
* ``worker_process``: the parent's side of one worker process (its start);
* ``timeouts``: the watchdog of a pool's per-call timeout;
* ``answers``: the decoding of a call's DONE into values or an error;
* ``errors``: the pool's exceptions;
* ``statistics``: each pool's counters (``pfb.stats().pools``);
* ``pickling``: how a function travels to a worker, and its token;
* ``spawn``: the one thread that starts every worker;
* ``fork``: a forked child's copy of the pools' shared memory.

The worker's side is ``pyfunc_bridge.worker``; the C and the compiled
module, ``src/pool/``.
"""
