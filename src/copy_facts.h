/* The copy facts of a result: who else can write its memory, and its
 * alignment.  The one rule, which the conversion layer judges in this
 * process (src/conversion/copy.pxi, outputs.pxi, converters.pxi,
 * frameworks.pxi) and a pool's workers judge for the parent's copy=False
 * (src/pool/facts.pxi, called by pyfunc_bridge/worker/memory.py, and
 * the result arena's exclusivity, result_arena.pxi): so copy=False refuses
 * in a pool what it refuses in-process.  The copy decision on the facts is
 * _copy_reason's (copy.pxi).  Declared once, src/pool/includes/copy_facts.pxd.
 *
 * Header-only: each extension compiles its own copy, and the worker's needs
 * no TensorFlow.  Include after Python.h and numpy/arrayobject.h.
 */
#ifndef PFB_COPY_FACTS_H_
#define PFB_COPY_FACTS_H_

#include <stdint.h>

/* How the caller judges the object that ends a result's base chain when it
 * is not an array (memory that object holds). */
enum {
  PFB_END_FOREIGN = 0,   /* anyone's: Python may write it */
  PFB_END_PRIVATE = 1,   /* an input that is the call's alone, held by the chain only */
  PFB_END_READ_ONLY = 2, /* an input that nobody can write (TensorFlow's memory) */
};
typedef int (*pfb_chain_end_fn)(PyObject *end, void *ctx);

/* Whether a weak reference (which can hand the object out again) exists. */
static inline int pfb_weakly_referenced(PyObject *obj) {
  Py_ssize_t offset = Py_TYPE(obj)->tp_weaklistoffset;
  if (offset > 0) return *(PyObject **)((char *)obj + offset) != NULL;
  return offset != 0; /* managed weak references (3.12 heap types): assume one, which only copies */
}

/* Whether Python could write ndarray `obj`'s memory after the call, given
 * the `outside_refs` references to it that the caller does not hold.
 *
 * Runs on borrowed pointers, so that no reference taken here skews the
 * counts.  The memory is safe when every array on the base chain is
 * referenced (strongly, and not weakly) only by its successor, and the chain
 * ends at an array that owns its data (a fresh array or a private view of
 * one), or at an object `end_kind` judges PFB_END_READ_ONLY (then whoever
 * holds the chain cannot write it) or PFB_END_PRIVATE. */
static inline int pfb_writable_elsewhere(PyObject *obj, Py_ssize_t outside_refs,
                                         pfb_chain_end_fn end_kind, void *ctx) {
  PyObject *last = obj;
  int exclusive = outside_refs == 0 && !pfb_weakly_referenced(obj);
  PyObject *base = PyArray_BASE((PyArrayObject *)obj);
  while (base != NULL && PyArray_Check(base)) {
    if (Py_REFCNT(base) != 1 || pfb_weakly_referenced(base)) exclusive = 0;
    last = base;
    base = PyArray_BASE((PyArrayObject *)base);
  }
  if (base != NULL) {
    int kind = end_kind(base, ctx);
    if (kind == PFB_END_READ_ONLY) {
      exclusive = 1;
    } else if (kind != PFB_END_PRIVATE) {
      exclusive = 0; /* memory the function did not allocate */
    }
  } else if (!(PyArray_FLAGS((PyArrayObject *)last) & NPY_ARRAY_OWNDATA)) {
    exclusive = 0; /* foreign memory wrapped without an owner */
  }
  return !exclusive;
}

/* Whether ndarray `obj`'s data is aligned to `align` bytes.  `as_allocated`:
 * as if every array that owns its data had been allocated aligned, as the
 * parent's allocator does (alloc.pxi) and a worker's NumPy does not: a view
 * of such an array is aligned where its offset into it is.  Other memory
 * is judged by its address. */
static inline int pfb_array_aligned(PyObject *obj, uintptr_t align, int as_allocated) {
  uintptr_t origin = 0;
  if (as_allocated) {
    PyObject *last = obj;
    PyObject *base = PyArray_BASE((PyArrayObject *)obj);
    while (base != NULL && PyArray_Check(base)) {
      last = base;
      base = PyArray_BASE((PyArrayObject *)base);
    }
    if (base == NULL && (PyArray_FLAGS((PyArrayObject *)last) & NPY_ARRAY_OWNDATA))
      origin = (uintptr_t)PyArray_DATA((PyArrayObject *)last);
  }
  return ((uintptr_t)PyArray_DATA((PyArrayObject *)obj) - origin) % align == 0;
}

/* How often the list or tuple `container` holds `item` in its storage (0
 * for any other object, whatever isinstance says of it). */
static inline Py_ssize_t pfb_stored(PyObject *container, PyObject *item) {
  Py_ssize_t count = 0;
  if (PyList_Check(container)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(container); i++)
      count += PyList_GET_ITEM(container, i) == item;
  } else if (PyTuple_Check(container)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(container); i++)
      count += PyTuple_GET_ITEM(container, i) == item;
  }
  return count;
}

/* The references to item `i` of the tuple `items` (what iterating the
 * function's list or tuple `result` yielded) that the caller does not hold.
 * One per occurrence in `items` and, for a tuple made from `result`, in
 * `result`'s storage are the caller's; a `result` held by someone else
 * (`result_outside` > 0) still reaches its items.  Taken for every item
 * before the first export adds references. */
static inline Py_ssize_t pfb_item_outside_refs(PyObject *items, PyObject *result, Py_ssize_t i,
                                               Py_ssize_t result_outside) {
  PyObject *item = PyTuple_GET_ITEM(items, i);
  Py_ssize_t held = pfb_stored(items, item);
  if (items != result) held += pfb_stored(result, item);
  return Py_REFCNT(item) - held + (result_outside > 0 ? 1 : 0);
}

/* Whether the memory [start, start + nbytes) lies inside one of `ranges`, a
 * list of (lo, hi) addresses of the call's inputs: TensorFlow's memory,
 * which nobody may write, so a view of it is not foreign.  -1: an error. */
static inline int pfb_inside(uintptr_t start, uintptr_t nbytes, PyObject *ranges) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ranges); i++) {
    PyObject *pair = PyList_GET_ITEM(ranges, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_SetString(PyExc_TypeError, "pyfunc_bridge: an input range is not a (lo, hi) pair");
      return -1;
    }
    unsigned long long lo = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
    unsigned long long hi = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 1));
    if (PyErr_Occurred()) return -1;
    if (lo <= start && start + nbytes <= hi) return 1;
  }
  return 0;
}

#endif /* PFB_COPY_FACTS_H_ */
