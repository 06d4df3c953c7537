# The records of the rings (shm_layout.h) as Python sees them: message
# kinds, tensor and CALL flags, copy-fact bits, the Message tuple, and the
# dtype table's lookups for them.

ALIGN = PFB_POOL_ALIGN
REQUESTS = 0
REPLIES = 1
MSG_LOAD = PFB_POOL_MSG_LOAD
MSG_CALL = PFB_POOL_MSG_CALL
MSG_RESULTS_BACK = PFB_POOL_MSG_RESULTS_BACK
MSG_FORGET = PFB_POOL_MSG_FORGET
MSG_DONE = PFB_POOL_MSG_DONE
MSG_INPUTS_BACK = PFB_POOL_MSG_INPUTS_BACK
MSG_WORDS = PFB_POOL_MSG_WORDS
TENSOR_STRINGS = PFB_POOL_TENSOR_STRINGS
TENSOR_PICKLED = PFB_POOL_TENSOR_PICKLED
TENSOR_SHARED = PFB_POOL_TENSOR_SHARED
CALL_WRITABLE = PFB_POOL_CALL_WRITABLE
CALL_SCALARS = PFB_POOL_CALL_SCALARS
CALL_TORCH = PFB_POOL_CALL_TORCH
CALL_FACTS = PFB_POOL_CALL_FACTS
CALL_FRAMEWORKS = PFB_POOL_CALL_FRAMEWORKS
CALL_PACKED = PFB_POOL_CALL_PACKED
TENSOR_SOCKET = PFB_POOL_TENSOR_SOCKET
TENSOR_SCALAR = PFB_POOL_TENSOR_SCALAR
LOAD_SOCKET = PFB_POOL_LOAD_SOCKET


def words_per_message(uint32_t ring_slots):
    """The words one INPUTS_BACK (or RESULTS_BACK, FORGET) carries at most on
    a ring of `ring_slots`: pfb_pool_words_per_message, the dispatcher's rule."""
    return pfb_pool_words_per_message(ring_slots)

# The CALL flag of each framework (shm_layout.h); None: NumPy.
FRAMEWORK_FLAGS = {None: 0, "torch": PFB_POOL_CALL_TORCH, "jax": PFB_POOL_CALL_JAX,
                   "cupy": PFB_POOL_CALL_CUPY}
FLAG_FRAMEWORKS = {flag: name for name, flag in FRAMEWORK_FLAGS.items() if flag}


def facts_flags(facts):
    """A result's copy facts, (writable_elsewhere, compact, aligned, lazy) or
    None (pyfunc_bridge/worker/memory.py, WorkerMemory.one_facts), as PfbPoolTensor flag bits."""
    if facts is None:
        return 0
    aliased, compact, aligned, lazy = facts
    return ((PFB_POOL_TENSOR_ALIASED if aliased else 0)
            | (0 if compact else PFB_POOL_TENSOR_STRIDED)
            | (0 if aligned else PFB_POOL_TENSOR_UNALIGNED)
            | (PFB_POOL_TENSOR_LAZY if lazy else 0))


def flags_facts(uint32_t flags):
    """facts_flags' inverse: None where no bit is set (copy=False refuses
    nothing)."""
    if not flags & PFB_POOL_TENSOR_REFUSED_MASK:
        return None
    return (bool(flags & PFB_POOL_TENSOR_ALIASED), not flags & PFB_POOL_TENSOR_STRIDED,
            not flags & PFB_POOL_TENSOR_UNALIGNED, bool(flags & PFB_POOL_TENSOR_LAZY))


DONE_ONE = PFB_POOL_DONE_ONE
DONE_TUPLE = PFB_POOL_DONE_TUPLE
DONE_LIST = PFB_POOL_DONE_LIST
STATUS_OK = PFB_POOL_STATUS_OK
STATUS_ERROR = PFB_POOL_STATUS_ERROR
STATUS_SOCKET = PFB_POOL_STATUS_SOCKET
HANDLER_NAME = "pyfunc_bridge_result_arena"

# A message read from a ring: `items` are its words (offsets, tokens), or for
# a CALL or DONE its tensors, each (code, bits, lanes, flags, offset, size,
# shape).
Message = collections.namedtuple(
    "Message", "kind call_id token flags status stamp block items ended")

cdef set _TENSOR_KINDS = {PFB_POOL_MSG_CALL, PFB_POOL_MSG_DONE}


cdef tuple _tensor_item(const PfbPoolTensor* record, const int64_t* dims):
    """A Message's item of a tensor record and its dims (all of them)."""
    return (record.code, record.bits, record.lanes, record.flags, record.offset, record.size,
            tuple([dims[d] for d in range(record.ndim)]))


cdef object _message(const PfbPoolMessage* m, list items):
    """The Message of a message's header `m` and its items (the ring's
    reader and the one decoder of a DONE, Reply, make each so)."""
    return Message(m.kind, m.call_id, m.token, m.flags, m.status, m.stamp,
                   (m.block_offset, m.block_size), items, m.ended)


# ----------------------------------------------------------------- dtypes --
# A record's dtype is DLPack's (code, bits), by the project's one dtype table
# (src/dtype_table.h, shared with the kernel and the conversion layer), for
# the records Python posts (route.pxi), those the worker reads and writes
# (pyfunc_bridge/worker/ring_server.py) and the replies the parent decodes
# (pyfunc_bridge/pool/answers.py, decode_answer).
cdef tuple _ROW_NAMES = tuple([pfb_dtypes[i].name.decode() for i in range(PFB_NUM_DTYPES)])


def dl_dtype(cnp.dtype dtype not None):
    """(code, bits, lanes) of a NumPy dtype in the table, in native byte
    order, or None."""
    cdef int row = pfb_dtype_by_numpy(dtype.kind, dtype.itemsize)
    if row < 0 or not (dtype.itemsize == 1 or dtype.isnative):
        return None
    # (Python's names: the cimported property reads a NULL as a tuple.)
    if dtype.kind == c'V' and ((<object>dtype).names is not None
                               or (<object>dtype).name != _ROW_NAMES[row]):
        return None  # raw bytes, or another ml_dtypes type
    return pfb_dtypes[row].code, pfb_dtypes[row].bits, 1


cdef dict _NP_DTYPES = {}  # (code, bits) -> np_dtype's answer: each call and result asks


def np_dtype(int code, int bits):
    """The NumPy dtype of a record's (code, bits): dl_dtype's inverse."""
    made = _NP_DTYPES.get((code, bits))
    if made is None:
        row = pfb_dtype_by_dl(code, bits, 1)
        if row < 0:
            raise ValueError(f"pyfunc_bridge: a tensor of DLPack dtype ({code}, {bits}) "
                             f"cannot cross the ring")
        if pfb_dtypes[row].numpy_kind == c'V':
            import ml_dtypes  # noqa: F401 - names its types to NumPy (a worker's first bfloat16)
        made = _NP_DTYPES[(code, bits)] = np.dtype(_ROW_NAMES[row])
    return made


