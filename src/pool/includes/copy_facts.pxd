# The one declaration of src/copy_facts.h, the copy facts' rule that the
# conversion layer (in-process) and a pool's workers (facts.pxi) both call.
from libc.stdint cimport uintptr_t
from cpython.ref cimport PyObject

cdef extern from "copy_facts.h":
    enum:
        PFB_END_FOREIGN
        PFB_END_PRIVATE
        PFB_END_READ_ONLY
    ctypedef int (*pfb_chain_end_fn)(PyObject* end, void* ctx) noexcept

    bint pfb_weakly_referenced(PyObject* obj) noexcept
    bint pfb_writable_elsewhere(PyObject* obj, Py_ssize_t outside_refs,
                                pfb_chain_end_fn end_kind, void* ctx) noexcept
    bint pfb_array_aligned(PyObject* obj, uintptr_t align, bint as_allocated) noexcept
    Py_ssize_t pfb_item_outside_refs(PyObject* items, PyObject* result, Py_ssize_t i,
                                     Py_ssize_t result_outside) noexcept
    int pfb_inside(uintptr_t start, uintptr_t nbytes, object ranges) except -1
