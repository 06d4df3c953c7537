# The records of the rings (shm_layout.h) as Python sees them: message
# kinds, tensor and CALL flags, copy-fact bits, the Message tuple, and the
# one dtype table.

ALIGN = PFB_POOL_ALIGN
SLOT_BYTES = PFB_POOL_SLOT_BYTES
REQUESTS = 0
REPLIES = 1
MSG_LOAD = PFB_POOL_MSG_LOAD
MSG_CALL = PFB_POOL_MSG_CALL
MSG_RESULTS_BACK = PFB_POOL_MSG_RESULTS_BACK
MSG_FORGET = PFB_POOL_MSG_FORGET
MSG_STOP = PFB_POOL_MSG_STOP
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
# The CALL flag of each framework (shm_layout.h); None: NumPy.
FRAMEWORK_FLAGS = {None: 0, "torch": PFB_POOL_CALL_TORCH, "jax": PFB_POOL_CALL_JAX,
                   "cupy": PFB_POOL_CALL_CUPY}
FLAG_FRAMEWORKS = {flag: name for name, flag in FRAMEWORK_FLAGS.items() if flag}


def facts_flags(facts):
    """A result's copy facts, (writable_elsewhere, compact, aligned, lazy) or
    None (pyfunc_bridge/worker/copy_facts.py, CopyFacts.one_facts), as PfbPoolTensor flag bits."""
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


# ----------------------------------------------------------------- dtypes --
# DLPack's DLDataTypeCode (PfbPoolTensor.code) of each NumPy dtype kind whose
# values travel as memory, bfloat16's apart: the one table, for the records
# Python posts (route.pxi), those the worker reads and writes
# (pyfunc_bridge/worker/ring_server.py) and the replies the parent decodes
# (pyfunc_bridge/pool/answers.py, decode_answer).
cdef dict _DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
cdef dict _DL_KINDS = {code: kind for kind, code in _DL_CODES.items()}
cdef int _DL_BFLOAT = 4  # kDLBfloat


def dl_dtype(dtype):
    """(code, bits, lanes) of a NumPy dtype whose values travel as memory,
    or None."""
    code = _DL_CODES.get(dtype.kind)
    if code is not None and (dtype.isnative or dtype.itemsize == 1):
        return code, dtype.itemsize * 8, 1
    if dtype.kind == "V" and dtype.name == "bfloat16" and dtype.names is None:
        return _DL_BFLOAT, 16, 1
    return None


cdef dict _NP_DTYPES = {}  # (code, bits) -> np_dtype's answer: each call and result asks


def np_dtype(int code, int bits):
    """The NumPy dtype of a record's (code, bits): dl_dtype's inverse."""
    made = _NP_DTYPES.get((code, bits))
    if made is None:
        kind = _DL_KINDS.get(code)
        if code == _DL_BFLOAT and bits == 16:
            import ml_dtypes
            made = np.dtype(ml_dtypes.bfloat16)
        elif kind is None or bits % 8:
            raise ValueError(f"pyfunc_bridge: a tensor of DLPack dtype ({code}, {bits}) "
                             f"cannot cross the ring")
        else:
            made = np.dtype(f"{kind}{bits // 8}")
        _NP_DTYPES[(code, bits)] = made
    return made


