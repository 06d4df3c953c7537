# The one declaration of dtype_table.h, the project's dtype table (cimported
# by the conversion layer and by the pool module: setup.py puts src/ on both
# include paths).
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "dtype_table.h" nogil:
    enum:
        PFB_NUM_DTYPES
        PFB_TF_DT_STRING
        PFB_TF_DT_BOOL
        PFB_DL_BFLOAT

    ctypedef struct PfbDtype:
        const char* name
        int32_t tf_enum
        uint8_t code
        uint8_t bits
        char numpy_kind

    const PfbDtype pfb_dtypes[]

    int pfb_dtype_by_tf(int tf_enum)
    int pfb_dtype_by_dl(int code, int bits, int lanes)
    int pfb_dtype_by_numpy(char kind, int64_t itemsize)
