# The C this module reads itself: atomic loads and stores of the control
# segment's shared words, the pool's clock, reference counts, and NumPy
# array fields.

cdef extern from *:
    """
    /* The control segment's words that the other process reads: atomic. */
    static inline uint64_t pfb_load64(uint64_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void pfb_store64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    """
    uint64_t pfb_load64(uint64_t* p) nogil
    void pfb_store64(uint64_t* p, uint64_t v) nogil

cdef extern from "futex.h" nogil:
    int64_t pfb_clock_ns(int clock)  # (clockid_t)

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject* obj)
    PyTypeObject* Py_TYPE(PyObject* obj)

cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyArrayObject
    PyTypeObject PyArray_Type
    void* PyArray_DATA(PyArrayObject* arr)
    bint PyArray_IS_C_CONTIGUOUS(PyArrayObject* arr)
    cnp.npy_intp PyArray_NBYTES(PyArrayObject* arr)
