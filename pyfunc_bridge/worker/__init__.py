"""The worker side of a ProcessPool (pyfunc_bridge/pool/): the process a
worker runs, and the frames on its socket, which both sides use.

Its modules, one concept each, are listed in docs/design.md's layer table.

Nothing here imports the package's ``__init__`` (TensorFlow): a worker
registers this package alone (start_worker) and imports its modules by the
names they have in the parent.

Calls come on the rings of the worker's control segment (src/pool/shm_layout.h,
which also says who owns each block when), served by RingServer one at a
time.  The socket, one length-prefixed pickle per frame, carries:

* parent -> worker, first: ``{"path": sys.path}``, and with a pool timeout
  ``"deadlines": {"trace_fd", "load_grace_ns"}`` (the segments' and the
  doorbell's descriptors come on the command line, start_worker.py);
* worker -> parent, first: ``("ready", pid)``;
* worker -> parent: ``("need", id)``, asking for a pulled payload (an input
  or a CALL's argument list that did not fit the arena or the ring, a LOAD's
  function), answered by ``("payload", id, pickle or None)``; and
  ``("ring", call_id, ok, pickle, facts)``, an answer too large for the
  result arena (the results as a list, which the parent shapes as the DONE's
  flags say, or the error), sent before its DONE;
* the end of the stream: the pool closed (seen here) or the worker died
  (seen by the parent).

While a function runs, NumPy allocates its large arrays in the result arena
(memory.py), so a fresh result that nothing else in the worker can reach is
sent by its offset without a copy.
"""
