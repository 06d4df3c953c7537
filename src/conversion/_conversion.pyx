# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""Conversion layer of pyfunc_bridge: DLPack <-> NumPy, copy policy, strings.

The kernel hands every call over through the PfbBridgeApi capsule
(``_bridge_api``): inputs arrive as DLPack tensors, the registered function runs
with 64-byte aligned NumPy allocation, and its results go back as DLPack
tensors checked against the op's declared dtypes and shapes.
"""
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport (
    PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New, PyCapsule_SetName,
)
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.list cimport PyList_Check, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport (
    PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM,
)
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset, strcmp, strlen, strncpy

cimport numpy as cnp

from includes.bridge_abi cimport *
from includes.dlpack cimport *
from includes.numpy_c cimport (
    NPY_ARRAY_OWNDATA, NPY_ARRAY_WRITEABLE, PyArray_BASE, PyArray_FLAGS, PyArray_Check, PyArray_DATA,
    PyArray_Descr, PyArray_IS_C_CONTIGUOUS, PyArray_NewFromDescr, PyArray_SIZE, PyArrayObject,
    npy_intp,
)

import threading
import traceback
import weakref

import ml_dtypes
import numpy as np

cnp.import_array()

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    Py_ssize_t Py_REFCNT(PyObject* o)
    PyTypeObject* Py_TYPE(PyObject* o)
    # The one field of the type object read here.
    ctypedef struct PyTypeWeaklist "PyTypeObject":
        Py_ssize_t tp_weaklistoffset

include "alloc.pxi"
include "dtypes.pxi"
include "dlpack.pxi"
include "dlpack_import.pxi"
include "dlpack_export.pxi"
include "strings.pxi"
include "stats.pxi"
include "outputs.pxi"
include "frameworks.pxi"
include "errors.pxi"
include "tensors.pxi"
include "bridge.pxi"
include "eager.pxi"
include "dlpack_api.pxi"
