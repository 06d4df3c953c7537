// The kernel's only contact with CPython: a GIL scope that reuses one thread
// state per thread, a guard against interpreter shutdown, and the lookup of the
// conversion layer's PfbBridgeApi table.  Nothing else in the kernel includes
// Python.h.
#ifndef PYFUNC_BRIDGE_KERNEL_PYTHON_GIL_H_
#define PYFUNC_BRIDGE_KERNEL_PYTHON_GIL_H_

#include "absl/status/status.h"
#include "bridge_abi.h"

namespace pyfunc_bridge {

// Holds the GIL for its lifetime.  On a thread that has never run Python (a
// TF worker) it creates one thread state and keeps it until the thread exits,
// so later scopes cost a PyEval_RestoreThread instead of a thread-state
// churn.  Reentrant: a thread that already holds the GIL keeps it.  After the
// package's atexit hook has run, only the thread that ran it enters Python.
class GilScope {
 public:
  GilScope();
  ~GilScope();
  GilScope(const GilScope&) = delete;
  GilScope& operator=(const GilScope&) = delete;
  // False when Python is shutting down; then the GIL is not held.
  bool ok() const { return ok_; }
  // True on threads whose Python thread state the bridge created (TF's
  // worker threads), false on threads that Python itself runs.
  static bool OnWorkerThread();

 private:
  bool ok_ = false;
  bool counted_ = false;  // in the worker in-flight count
  int state_ = 0;  // a PyGILState_STATE
  bool first_on_thread_ = false;
};

// Lets go of the GIL for its lifetime where this thread holds it (a caller
// that entered TF from Python may), so that other Python threads run while
// the kernel waits for them.
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  void* saved_ = nullptr;  // this thread's PyThreadState while released
};

// The conversion layer's API table (imports pyfunc_bridge._conversion on first
// use).  The GIL must be held.
absl::Status GetBridgeApi(const PfbBridgeApi** api);

// Calls a DLPack deleter that may touch Python, taking the GIL when it can.
// After shutdown began the tensor is leaked rather than touching Python.
void ReleaseWithGil(DLManagedTensorVersioned* managed);

// Drops a reference to a Python object (a PyObject*), taking the GIL when it
// can.  After shutdown began the object is leaked rather than touching Python.
void DecrefWithGil(void* object);

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_PYTHON_GIL_H_
