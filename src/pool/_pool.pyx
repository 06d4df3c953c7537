# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: embedsignature=True
"""A ProcessPool worker's compiled module: the pool's shared memory
(src/pool/shm_layout.h) as Python sees it, and the NumPy data-memory handler
that puts a function's fresh arrays in the worker's result arena.

It holds the C the worker shares with the kernel (src/pool/: the arena
allocator, the rings, the message records) and needs neither TensorFlow nor
the op library: setup.py builds it from src/pool/ with NumPy's headers only,
and a worker loads it by path (``pool_module`` in pyfunc_bridge/worker/compiled.py),
never through the package, whose import would bring TensorFlow in.

* ``Arena``: the block allocator of an arena (offsets only).
* ``Channel``: a worker's control segment, its request and reply rings.
* ``ResultArena``: a worker's result arena and its NumPy handler: while
  ``call`` runs a function, NumPy allocates the function's arrays in the
  arena, so that a fresh result is already in shared memory; ``take`` hands
  such a result to the parent without a copy when nothing else in the worker
  can still reach it.

Its parts, one concept per .pxi (included below): externs (the C read
directly), records (message kinds, flags, the dtype table), arena (Arena),
ring (Channel), reply (Reply, NativeArena, native_reply), route (Route),
dispatcher (Dispatcher), result_arena (ResultArena and its NumPy handler).
"""
from libc.errno cimport (E2BIG, EAGAIN, EINVAL, EMSGSIZE, ENOMEM, ENOSPC, EPIPE, EPROTO,
                         ETIMEDOUT)
from libc.stdint cimport SIZE_MAX, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset, strncpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE

cimport numpy as cnp

from includes.arena cimport *
from includes.dispatch cimport *
from includes.numpy_handler cimport PyDataMem_Handler, PyDataMem_SetHandler
from includes.pthread cimport *
from includes.records cimport *
from includes.ring cimport *
from includes.shm_layout cimport *

import collections
import os

cnp.import_array()

# One concept per file, in dependency order (a cdef class before the code
# that types a variable with it).
include "externs.pxi"
include "records.pxi"
include "arena.pxi"
include "ring.pxi"
include "reply.pxi"
include "route.pxi"
include "dispatcher.pxi"
include "result_arena.pxi"
