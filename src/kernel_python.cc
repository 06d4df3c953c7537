#include "kernel_python.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace pyfunc_bridge {
namespace {

std::atomic<bool> g_shutting_down{false};
// GilScopes that have passed the shutdown check and may take the GIL.
std::atomic<int> g_in_flight{0};
// How long interpreter exit waits for bridge calls already under way.
constexpr auto kDrainTimeout = std::chrono::seconds(10);
std::atomic<const PfbBridgeApi*> g_api{nullptr};

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Registered with atexit the first time the bridge is used.  From then on no
// new kernel or deleter enters Python, and the calls already under way are
// let finish (with the GIL released) before finalization begins: CPython
// terminates a thread that asks for the GIL during finalization, and a TF
// worker thread that vanishes mid-kernel hangs whoever waits for its result.
PyObject* OnPythonExit(PyObject*, PyObject*) {
  g_shutting_down.store(true);
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  Py_BEGIN_ALLOW_THREADS
  while (g_in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}
PyMethodDef g_on_exit_def = {"_pyfunc_bridge_kernel_atexit", OnPythonExit,
                             METH_NOARGS, nullptr};

absl::Status PythonErrorToStatus(const char* what) {
  std::string message = what;
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  if (value != nullptr) {
    PyObject* text = PyObject_Str(value);
    if (text != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(text);
      if (utf8 != nullptr) message += std::string(": ") + utf8;
      Py_DECREF(text);
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return absl::InternalError(message);
}

absl::Status RegisterAtExit() {
  PyObject* atexit = PyImport_ImportModule("atexit");
  if (atexit == nullptr) return PythonErrorToStatus("cannot import atexit");
  PyObject* hook = PyCFunction_New(&g_on_exit_def, nullptr);
  PyObject* result =
      hook ? PyObject_CallMethod(atexit, "register", "O", hook) : nullptr;
  Py_XDECREF(result);
  Py_XDECREF(hook);
  Py_DECREF(atexit);
  if (result == nullptr) return PythonErrorToStatus("cannot register atexit");
  return absl::OkStatus();
}

}  // namespace

bool PythonUsable() {
  return !g_shutting_down.load(std::memory_order_relaxed) &&
         Py_IsInitialized() && !InterpreterFinalizing();
}

namespace {
thread_local bool t_worker_thread = false;
}  // namespace

bool GilScope::OnWorkerThread() { return t_worker_thread; }

GilScope::GilScope() {
  // Counted before the check, so that exit either sees this scope or this
  // scope sees the exit (both atomics are sequentially consistent).
  g_in_flight.fetch_add(1);
  if (!PythonUsable()) {
    g_in_flight.fetch_sub(1);
    return;
  }
  thread_local bool pinned = false;
  if (!pinned) t_worker_thread = PyGILState_GetThisThreadState() == nullptr;
  state_ = PyGILState_Ensure();
  if (!pinned) {
    // This Ensure is never paired with a Release: the thread state it found or
    // created stays alive (gilstate counter >= 1) for the life of the thread,
    // so nested Ensure/Release pairs (ours or a library's) never delete it.
    pinned = true;
    first_on_thread_ = true;
  }
  ok_ = true;
}

GilScope::~GilScope() {
  if (!ok_) return;
  if (first_on_thread_) {
    // Keep the pinned count, give back only the GIL if we took it.
    if (static_cast<PyGILState_STATE>(state_) == PyGILState_UNLOCKED) {
      PyEval_SaveThread();
    }
  } else {
    PyGILState_Release(static_cast<PyGILState_STATE>(state_));
  }
  g_in_flight.fetch_sub(1);
}

absl::Status GetBridgeApi(const PfbBridgeApi** api) {
  const PfbBridgeApi* cached = g_api.load(std::memory_order_acquire);
  if (cached == nullptr) {
    // Guarded by the GIL, not by a static initializer: importing may release
    // the GIL, and a thread blocked on an init guard while holding it would
    // deadlock.
    static bool atexit_registered = false;
    if (!atexit_registered) {
      atexit_registered = true;
      absl::Status s = RegisterAtExit();
      if (!s.ok()) return s;
    }
    auto* table = static_cast<const PfbBridgeApi*>(
        PyCapsule_Import(PFB_BRIDGE_CAPSULE, 0));
    if (table == nullptr) {
      return PythonErrorToStatus(
          "pyfunc_bridge: cannot import the conversion layer "
          "(pyfunc_bridge._conversion)");
    }
    if (table->abi_version != PFB_BRIDGE_ABI_VERSION) {
      return absl::FailedPreconditionError(
          "pyfunc_bridge: the kernel library and the conversion module come "
          "from different builds (bridge ABI " +
          std::to_string(table->abi_version) + ", kernel expects " +
          std::to_string(PFB_BRIDGE_ABI_VERSION) +
          "); reinstall pyfunc_bridge");
    }
    g_api.store(table, std::memory_order_release);
    cached = table;
  }
  *api = cached;
  return absl::OkStatus();
}

void ReleaseWithGil(DLManagedTensorVersioned* managed) {
  if (managed == nullptr || managed->deleter == nullptr) return;
  GilScope gil;
  if (!gil.ok()) return;  // shutting down: leak instead of touching Python
  managed->deleter(managed);
}

}  // namespace pyfunc_bridge
