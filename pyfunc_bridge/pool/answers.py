"""The decoding of a call's answer: a DONE (its result records over the
worker's result arena, or an error), or an answer that came by the socket."""
import pickle
import threading

import numpy as np

from pyfunc_bridge import _locks
from pyfunc_bridge.pool import statistics
from pyfunc_bridge.pool.errors import WorkerError, raise_acyclic, worker_exception
from pyfunc_bridge.worker.compiled import pool_module


class RingAnswers:
    """Answers of native calls that went by a worker's socket (no room in
    its result arena: shm_layout.h, PFB_POOL_STATUS_SOCKET), by call id (ids
    are unique in the process), from the reader threads to decode_answer."""

    def __init__(self):
        self._answers = {}
        self._arrived = _locks.lock(threading.Condition)

    def put(self, call_id, answer):
        with self._arrived:
            self._answers[call_id] = answer
            self._arrived.notify_all()

    def take(self, call_id, pool_name):
        # The worker wrote it before the DONE: its reader has it or reads it
        # next (a dead worker's stream is read to its end first).
        with self._arrived:
            if not self._arrived.wait_for(lambda: call_id in self._answers,
                                          _RING_ANSWER_SECONDS):
                raise WorkerError(f"pyfunc_bridge: a worker of {pool_name} sent a call's "
                                  f"answer by its socket, and it never arrived")
            return self._answers.pop(call_id)


ring_answers = RingAnswers()
_RING_ANSWER_SECONDS = 60.0


def decode_answer(pool_name, reply, copied, counters, result_view):
    """(result, bytes moved, copy facts per result) of a DONE: `reply` is
    Route.call's Reply, or the address of a native call's DONE that the
    kernel does not turn into outputs itself (an error, a pickled value, a
    result the op does not declare, or one copy=False may refuse; its
    route counted the call).  Either way the pool module's one decoder of a
    DONE (reply_decode.h) checked its blocks and counts each result's share
    of the statistics; the Reply holds its result blocks until each is
    claimed, and arrays over one hand it back when they go.  `copied`:
    copy=True, which saves no copy; `counters` get the results' share;
    `result_view(arena, results, offset, size, dtype, shape)`: the
    conversion layer's array over a result block (worker_result), passed
    down by the caller."""
    pw = pool_module()
    if not isinstance(reply, pw.Reply):
        reply = pw.Reply(reply)
    message = reply.message
    read_block = reply.read

    def loads(data):
        try:
            return pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - this call's error; the worker lives on
            raise WorkerError(f"pyfunc_bridge: a worker of {pool_name} sent a reply this "
                              f"process cannot unpickle ({type(exc).__name__}: {exc})") from exc

    values, facts = [], []
    bytes_out = saved = moved = 0
    if message.status == pw.STATUS_SOCKET:  # (its DONE has no records: the loop adds none)
        ok, data, facts = ring_answers.take(message.call_id, pool_name)
        if not ok:
            raise_acyclic(worker_exception(pickle.loads(data)))
        values = loads(data)  # the results as a list, shaped below as the DONE's are
        bytes_out = sum(map(statistics.data_bytes, values))
    elif message.status != pw.STATUS_OK:
        offset, size = message.block
        raise_acyclic(
            worker_exception(pickle.loads(read_block(offset, size))) if size
            else RuntimeError(f"pyfunc_bridge: a worker of {pool_name} failed a call "
                              f"and could not send its error (no room in its arena)"))
    for (code, bits, lanes, flags, offset, size, shape), (nbytes, saves, worker_copied) in zip(
            message.items, reply.counted):
        if flags & pw.TENSOR_PICKLED:
            values.append(loads(read_block(offset, size)))
            bytes_out += statistics.data_bytes(values[-1])
        elif flags & pw.TENSOR_SCALAR:  # a scalar again: the checks judge and word it so
            values.append(np.frombuffer(read_block(offset, nbytes), pw.np_dtype(code, bits))[0])
            bytes_out += nbytes
        else:  # numbers: a view of the block (strings come back pickled)
            dtype = pw.np_dtype(code, bits)
            values.append(reply.view(result_view, offset, size, dtype, shape)
                          if size else np.zeros(shape, dtype))
            bytes_out += nbytes
        saved += saves
        moved += worker_copied
        facts.append(pw.flags_facts(flags))
    if counters is not None:
        counters.add(bytes_out=bytes_out, copies_saved=0 if copied else saved)
    if message.flags == pw.DONE_ONE and len(values) == 1:
        return values[0], moved, facts
    return (values if message.flags == pw.DONE_LIST else tuple(values)), moved, facts
