#include "python_gil.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cxxabi.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace pyfunc_bridge {
namespace {

std::atomic<bool> g_shutting_down{false};
// The thread that runs the exit (the package's atexit hook); its own scopes
// are neither counted nor refused.
std::atomic<std::thread::id> g_exit_thread{};
// GIL scopes that have passed the shutdown check and may take the GIL.
std::atomic<int> g_in_flight{0};
// Of those, the ones on this thread.
thread_local int t_in_flight = 0;
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

bool InterpreterRunning() { return Py_IsInitialized() && !InterpreterFinalizing(); }

// Whether this thread's Python thread state is the one holding the GIL.
bool HoldsGil() {
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* current = PyThreadState_GetUnchecked();
#else
  PyThreadState* current = _PyThreadState_UncheckedGet();
#endif
  return current != nullptr && current == PyGILState_GetThisThreadState();
}

bool Usable() {
  return !g_shutting_down.load(std::memory_order_relaxed) && InterpreterRunning();
}

// Enters the in-flight count; false (and not counted) once shutdown has
// begun.  Counted before the check, so that exit either sees this thread or
// this thread sees the exit (both atomics are seq_cst).
bool EnterCounted() {
  g_in_flight.fetch_add(1);
  if (g_shutting_down.load() || !InterpreterRunning()) {
    g_in_flight.fetch_sub(1);
    return false;
  }
  ++t_in_flight;
  return true;
}

void LeaveCounted() {
  --t_in_flight;
  g_in_flight.fetch_sub(1);
}

// Thread states of TF worker threads that have exited, cleared by the next
// thread that holds the GIL.  An exiting thread must not wait for the GIL
// itself: the thread that joins it may be holding it.
std::mutex g_graveyard_mutex;
std::vector<PyThreadState*> g_graveyard;
std::atomic<bool> g_graveyard_full{false};
// Cleared thread states whose deletion could not start (no thread could be
// created); retried at the next burial.  Guarded by the GIL.
std::vector<PyThreadState*> g_cleared;

// Deletes cleared thread states on a thread that has no Python thread state.
// Since CPython 3.12, PyThreadState_Delete unbinds the PyGILState binding of
// the thread that calls it (it assumes the owner deletes its own state), so a
// thread that runs Python would lose its own binding, never again see that it
// holds the GIL, and keep it for ever.  Deleting needs no GIL.
void DeleteOnUnboundThread(std::vector<PyThreadState*>& cleared) {
  try {
    std::thread([&cleared] {
      for (PyThreadState* ts : cleared) PyThreadState_Delete(ts);
    }).join();
    cleared.clear();
  } catch (const std::system_error&) {
    // Kept for the next burial; exit frees them with the interpreter if none comes.
  }
}

// GIL held: clears (threading.local data included) and deletes them.  Clearing
// runs Python code (destructors), so it needs this thread's binding intact.
void BuryExitedThreadStates() {
  if (!g_graveyard_full.load(std::memory_order_acquire) && g_cleared.empty()) return;
  std::vector<PyThreadState*> dead;
  {
    std::lock_guard<std::mutex> lock(g_graveyard_mutex);
    dead.swap(g_graveyard);
    g_graveyard_full.store(false, std::memory_order_release);
  }
  for (PyThreadState* ts : dead) {
    PyThreadState_Clear(ts);
    g_cleared.push_back(ts);
  }
  DeleteOnUnboundThread(g_cleared);
}

// A forked child's Python (PyOS_AfterFork_Child) frees every thread state but
// the forking thread's, those waiting here included: the child forgets them.
// The mutex is held across fork so that no thread leaves it locked there.  The
// bridge calls under way on other threads are not in the child either: its
// exit would wait kDrainTimeout for them (the forking thread's own are kept).
[[maybe_unused]] const bool g_fork_handlers = [] {
  pthread_atfork([] { g_graveyard_mutex.lock(); },
                 [] { g_graveyard_mutex.unlock(); },
                 [] {
                   g_in_flight.store(t_in_flight);
                   g_graveyard.clear();
                   g_cleared.clear();
                   g_graveyard_full.store(false);
                   g_graveyard_mutex.unlock();
                 });
  return true;
}();

// The Python thread state a TF worker thread pinned for itself; handed to the
// graveyard when the thread exits (leaked once shutdown has begun).
struct PinnedThreadState {
  bool pinned = false;
  bool worker = false;  // the bridge created the thread state
  PyThreadState* state = nullptr;
  ~PinnedThreadState() {
    if (!pinned || !worker || state == nullptr || !Usable()) return;
    std::lock_guard<std::mutex> lock(g_graveyard_mutex);
    g_graveyard.push_back(state);
    g_graveyard_full.store(true, std::memory_order_release);
  }
};
thread_local PinnedThreadState t_pinned;

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

// What std::terminate did before exit installed ParkOrTerminate.
std::terminate_handler g_previous_terminate = nullptr;
// Set while this thread's ParkOrTerminate looks at the exception, so that a
// terminate without one (the rethrow below then terminates) is passed on.
thread_local bool t_terminating = false;

// During finalization CPython ends a thread that asks for the GIL (a daemon
// thread coming back from TF's C++) with pthread_exit.  Where that forced
// unwinding meets a noexcept frame of TF's (pybind11's gil_scoped_release
// destructor, around every graph-building call), C++ calls std::terminate,
// which would abort the process; that thread is parked until the process
// exits instead, since it was ending anyway.  Any other terminate is passed on.
[[noreturn]] void ParkOrTerminate() {
  if (!t_terminating && g_shutting_down.load() &&
      std::this_thread::get_id() != g_exit_thread.load() && InterpreterFinalizing()) {
    t_terminating = true;
    try {
      throw;
    } catch (abi::__forced_unwind&) {
      for (;;) pause();
    } catch (...) {
    }
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

bool GilScope::OnWorkerThread() { return t_pinned.worker; }

GilScope::GilScope() {
  PinnedThreadState& pin = t_pinned;
  const bool worker =
      pin.pinned ? pin.worker : PyGILState_GetThisThreadState() == nullptr;
  if (std::this_thread::get_id() != g_exit_thread.load()) {
    // CPython ends a thread that asks for the GIL during finalization with
    // pthread_exit.  A TF worker must not die that way, nor may a Python
    // (daemon) thread in the middle of a bridge call: its forced unwinding
    // runs through TF's frames, and some of them end the process.  So exit
    // drains these calls first and refuses new ones
    // (PyfuncBridge_BeginShutdown).
    if (!EnterCounted()) return;
    counted_ = true;
  } else if (!InterpreterRunning()) {
    return;  // the exiting thread during finalization
  }
  state_ = PyGILState_Ensure();
  if (!pin.pinned) {
    // This Ensure is never paired with a Release: the thread state it found or
    // created stays alive (gilstate counter >= 1) until the thread exits, so
    // nested Ensure/Release pairs (ours or a library's) never delete it.
    pin.pinned = true;
    pin.worker = worker;
    pin.state = PyGILState_GetThisThreadState();
    first_on_thread_ = true;
  }
  // A TF worker runs no Python frame below us, so an exception set here is
  // stale: another library's kernel (TF's PyFunc with a token it cannot
  // decode) released the GIL without clearing it, and the thread state we
  // keep pinned carried it over.  Left set, our next call is a SystemError.
  if (pin.worker &&
      static_cast<PyGILState_STATE>(state_) == PyGILState_UNLOCKED &&
      PyErr_Occurred() != nullptr) {
    PyErr_Clear();
  }
  ok_ = true;
  BuryExitedThreadStates();
}

GilScope::~GilScope() {
  // A Python thread that waits for the GIL while the interpreter finalizes
  // (a daemon thread, in the function or in a TF op it called) is ended by
  // CPython with pthread_exit.  Its forced unwinding runs this destructor
  // without the GIL: releasing it then aborts the process, and the thread
  // is going away anyway.
  if (ok_ && HoldsGil()) {
    if (first_on_thread_) {
      // Keep the pinned count, give back only the GIL if we took it.
      if (static_cast<PyGILState_STATE>(state_) == PyGILState_UNLOCKED) {
        PyEval_SaveThread();
      }
    } else {
      PyGILState_Release(static_cast<PyGILState_STATE>(state_));
    }
  }
  if (counted_) LeaveCounted();
}

absl::Status GetBridgeApi(const PfbBridgeApi** api) {
  const PfbBridgeApi* cached = g_api.load(std::memory_order_acquire);
  if (cached == nullptr) {
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

GilRelease::GilRelease() {
  if (InterpreterRunning() && PyGILState_Check()) saved_ = PyEval_SaveThread();
}

GilRelease::~GilRelease() {
  if (saved_ != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(saved_));
}

void ReleaseWithGil(DLManagedTensorVersioned* managed) {
  if (managed == nullptr || managed->deleter == nullptr) return;
  GilScope gil;
  if (!gil.ok()) return;  // shutting down: leak instead of touching Python
  managed->deleter(managed);
}

void DecrefWithGil(void* object) {
  if (object == nullptr) return;
  GilScope gil;
  if (!gil.ok()) return;
  Py_DECREF(static_cast<PyObject*>(object));
}

}  // namespace pyfunc_bridge

// Called (GIL held) by the package's atexit hook, which `import pyfunc_bridge`
// registers, so it runs after any hook registered later.  From then on no
// thread but this one enters a bridge call, and the calls already under way
// may finish (the GIL is released meanwhile) before finalization begins.
extern "C" __attribute__((visibility("default"))) int PyfuncBridge_BeginShutdown() {
  using namespace pyfunc_bridge;
  g_exit_thread.store(std::this_thread::get_id());
  g_shutting_down.store(true);
  if (g_previous_terminate == nullptr) {
    g_previous_terminate = std::set_terminate(ParkOrTerminate);
  }
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  const int own = t_in_flight;  // scopes this thread is inside of (none, usually)
  int left = 0;
  Py_BEGIN_ALLOW_THREADS
  while ((left = g_in_flight.load() - own) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Py_END_ALLOW_THREADS
  return left;
}
