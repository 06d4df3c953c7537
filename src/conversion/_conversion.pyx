# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""Conversion layer of pyfunc_bridge: DLPack <-> NumPy / EagerTensors /
framework arrays, the copy policy, strings, statistics.

The kernel hands every call over through the PfbBridgeApi capsule
(``_bridge_api``); one driver runs it.  The life of one call:

1. The kernel's ``Compute()`` (src/kernel/numpy_function.cc, py_function.cc)
   calls ``BridgeKernel::RunBridge`` (src/kernel/bridge.cc) with the flags
   that describe the call (py_function: PFB_CALL_TENSORS, maybe _RECORD; its
   gradient: _GRADIENT).  Each input becomes a DLPack tensor (``ExportInput``),
   the GIL is taken (``GilScope``), and a ``PfbCall`` (bridge_abi.h) goes to
   ``_bridge_call`` (bridge.pxi).  An eager numpy_function / array_function
   call builds the same PfbCall in ``call_eagerly`` (eager.pxi) instead.
2. ``_run`` (bridge.pxi), the one driver: ``_trace_begin`` (trace.pxi: TF's
   profiler, one relaxed atomic load while no session records);
   ``_stats_begin``; ``_adopt_inputs``
   (one ``_DLPackOwner`` per input); ``_entry`` (the registry, the eager slot,
   or a gradient's recorded ``_Forward``; a key missing from the registry is
   resolved once from the op's portable description in the PfbCall, by
   ``_resolve_missing`` -> ``pyfunc_bridge/_resolve.py``, into an entry with
   the converter of the recorded framework); ``_converter``: the entry's
   ``_NUMPY`` (``_NUMPY_EAGER`` for an eager call) or ``_FrameworkConverter``
   (converters.pxi), or ``_TENSORS`` for the py_function kernels (tensors.pxi).
3. ``converter.enter``: aligned NumPy allocation, or eager mode + device scope
   (first: py_function's inputs are made in it).
4. ``converter.inputs``: owners -> read-only ndarray views (``_input_arrays``;
   in graphs a 0-d input becomes a NumPy scalar, ``_scalar_input``), framework
   arrays (``_framework_inputs``) or EagerTensors (``_input_tensors``: the
   kernel's own, ``PfbCall.eager``, where it has them, else from DLPack).
5. ``converter.call``: the function (py_function under a tape, its ``_Forward``
   put in ``PfbCall.state``; a gradient call: ``_Forward.gradient``).
6. ``converter.outputs``: ``_export_outputs`` (NumPy, array_function) or
   ``_export_results`` (py_function) -> per result ``_export_output`` (NumPy
   values, outputs.pxi) or ``_export_dlpack_output`` (DLPack producers,
   frameworks.pxi; py_function's EagerTensors through ``PfbCall.eager`` where
   the kernel has it) -> ``_export_owner``: dtype and shape checked, then
   ``_copy_reason`` (copy.pxi, the one copy decision) says share, or copy
   once (``_aligned_copy``).
7. ``converter.leave``; ``_trace_end`` (a traced call's events);
   ``_stats_end``.  On error ``_delete_outputs`` frees the
   outputs made so far and ``_bridge_call`` fills the PfbStatus
   (``_failure``, bridge.pxi; ``_status_of``, errors.pxi); ``call_eagerly``
   raises it as TF's error.  An eager call also leaves in its thread's slot
   what the op layer raises in its place: the function's exception as it is
   or combined with the TF error's class (``_eager_raised``, errors.pxi;
   ``take_raised``).
8. Back in ``RunBridge``, ``MakeOutput`` wraps each output without a copy
   (``DLPackBuffer``, or ``AliasBuffer`` for a view of an input; a TF tensor
   the kernel exported is the output itself); py_function's ``Compute()``
   adds the forward-state output where it is consumed.  ``call_eagerly`` wraps them
   as EagerTensors (``_eager_output``) instead.

The files are included in dependency order: each uses only earlier ones
(except that _DLPackOwner's protocol methods call dlpack_export.pxi).
"""
cimport cython
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport (
    PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New, PyCapsule_SetName,
)
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.weakref cimport PyWeakref_GET_OBJECT
from cpython.tuple cimport (
    PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM,
)
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset, strcmp, strlen, strncpy

cimport numpy as cnp

from includes.bridge_abi cimport *
from includes.copy_facts cimport *  # src/pool/includes: the rule a worker calls too
from includes.dlpack cimport *
from dtype_table cimport *
from includes.numpy_c cimport (
    NPY_ARRAY_OWNDATA, NPY_ARRAY_WRITEABLE, PyArray_BASE, PyArray_FLAGS, PyArray_Check, PyArray_DATA,
    PyArray_Descr, PyArray_IS_C_CONTIGUOUS, PyArray_Type, PyArray_NewFromDescr, PyArray_SIZE, PyArrayObject,
    PyArray_DIMS, PyArray_NDIM, npy_intp,
)

from collections.abc import Mapping
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

# DLPack and NumPy core
include "alloc.pxi"
include "dtypes.pxi"
include "dlpack_import.pxi"
include "dlpack.pxi"
include "copy.pxi"
include "dlpack_export.pxi"
include "strings.pxi"
include "stats.pxi"
include "outputs.pxi"
# TensorFlow and other frameworks
include "tf.pxi"
include "frameworks.pxi"
# The bridge
include "errors.pxi"
include "converters.pxi"
include "process.pxi"
include "tensors.pxi"
include "trace.pxi"
include "bridge.pxi"
include "eager.pxi"
include "dlpack_api.pxi"
