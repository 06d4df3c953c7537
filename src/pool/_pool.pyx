# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""The pool's compiled module (docs/pool.md): the shared memory of
src/pool/shm_layout.h as Python sees it, on both sides (the parent's
Dispatcher and Routes; a worker's rings and the NumPy handler of its result
arena).  It needs neither TensorFlow nor the op library: setup.py builds it
with NumPy's headers only, and a worker loads it by path
(pyfunc_bridge/worker/compiled.py), never through the package.
"""
from libc.errno cimport EINVAL, EMSGSIZE, ENOMEM, ENOSPC, EPIPE, EPROTO, ERANGE, ETIMEDOUT
from libc.stdint cimport SIZE_MAX, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset, strncpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE

cimport numpy as cnp

from includes.arena cimport *
from includes.copy_facts cimport *
from includes.dispatch cimport *
from includes.input_records cimport *
from includes.numpy_handler cimport PyDataMem_Handler, PyDataMem_SetHandler, PyDataMemAllocator
from includes.pthread cimport *
from includes.records cimport *
from includes.reply_decode cimport *
from includes.ring cimport *
from includes.route_counts cimport *
from includes.shm_layout cimport *
from dtype_table cimport *

import collections
import os

cnp.import_array()

# One concept per file, in dependency order (a cdef class before the code
# that types a variable with it).
include "externs.pxi"       # the C read directly (atomics, the clock, NumPy fields)
include "records.pxi"       # message kinds, flags, Message, the dtype table
include "ring.pxi"          # Channel
include "reply.pxi"         # NativeArena, Reply: the one decoder of a DONE
include "route.pxi"         # Route, Declined, DispatchFailed
include "dispatcher.pxi"    # Dispatcher
include "facts.pxi"         # a worker's copy facts (copy_facts.h)
include "result_arena.pxi"  # ResultArena and its NumPy handler
