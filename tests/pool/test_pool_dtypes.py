"""The pool records' dtypes (PfbPoolTensor's code and bits), the pool
module's lookups in the project's dtype table (src/dtype_table.h): each
row's NumPy dtype and back, and nothing outside the table, so that a worker
never describes in a record a dtype the kernel and the conversion layer do
not take (it sends such a value pickled, and the parent words the error as
in-process)."""
import ml_dtypes
import numpy as np
import pytest

from pyfunc_bridge import _pool as pw

# DLPack's (code, bits) of each NumPy dtype, written out by hand: the oracle.
ROWS = {
    np.dtype(np.float32): (2, 32), np.dtype(np.float64): (2, 64),
    np.dtype(np.float16): (2, 16), np.dtype(ml_dtypes.bfloat16): (4, 16),
    np.dtype(np.int8): (0, 8), np.dtype(np.int16): (0, 16),
    np.dtype(np.int32): (0, 32), np.dtype(np.int64): (0, 64),
    np.dtype(np.uint8): (1, 8), np.dtype(np.uint16): (1, 16),
    np.dtype(np.uint32): (1, 32), np.dtype(np.uint64): (1, 64),
    np.dtype(np.bool_): (6, 8), np.dtype(np.complex64): (5, 64),
    np.dtype(np.complex128): (5, 128),
}


@pytest.mark.parametrize("dtype", list(ROWS), ids=str)
def test_each_row_round_trips(dtype):
    code, bits = ROWS[dtype]
    assert pw.dl_dtype(dtype) == (code, bits, 1)
    assert pw.np_dtype(code, bits) == dtype


OUTSIDE = [np.dtype(np.longdouble), np.dtype(np.clongdouble), np.dtype("V2"),
           np.dtype(">i4"), np.dtype(">f2"), np.dtype(ml_dtypes.float8_e4m3fn),
           np.dtype([("a", "<f2")]), np.dtype("M8[s]"), np.dtype(object), np.dtype("S4")]


@pytest.mark.parametrize("dtype", OUTSIDE, ids=str)
def test_a_dtype_outside_the_table_has_no_record(dtype):
    assert pw.dl_dtype(dtype) is None


@pytest.mark.parametrize("code, bits", [(2, 128), (5, 256), (3, 128), (4, 32), (7, 8)])
def test_a_record_outside_the_table_is_refused(code, bits):
    with pytest.raises(ValueError, match="cannot cross the ring"):
        pw.np_dtype(code, bits)
