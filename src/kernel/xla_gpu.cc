// CUDA driver calls for the XLA custom calls (xla_gpu.h).  The driver
// library (libcuda.so.1) is the one TF's GPU runtime loaded; it is looked up,
// never loaded here, so the kernel library has no CUDA dependency and a
// CPU-only TensorFlow loads it unchanged.
#include "xla_gpu.h"

#include <dlfcn.h>

#include <cstdint>
#include <string>

namespace pyfunc_bridge {
namespace {

using CuResult = int;  // CUresult; 0 is CUDA_SUCCESS
using SynchronizeFn = CuResult (*)(void* stream);
using CopyFn = CuResult (*)(uintptr_t dst, uintptr_t src, size_t n, void* stream);
using GetContextFn = CuResult (*)(void** context);
using PushContextFn = CuResult (*)(void* context);
using PopContextFn = CuResult (*)(void** context);
using AllocFn = CuResult (*)(uintptr_t* pointer, size_t n);
using FreeFn = CuResult (*)(uintptr_t pointer);

struct Driver {
  SynchronizeFn synchronize = nullptr;
  CopyFn copy = nullptr;
  GetContextFn get_context = nullptr;
  PushContextFn push_context = nullptr;
  PopContextFn pop_context = nullptr;
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) return d;
    // The handle stays open: the process keeps the driver anyway.
    d.synchronize = reinterpret_cast<SynchronizeFn>(dlsym(lib, "cuStreamSynchronize"));
    d.copy = reinterpret_cast<CopyFn>(dlsym(lib, "cuMemcpyAsync"));
    d.get_context = reinterpret_cast<GetContextFn>(dlsym(lib, "cuCtxGetCurrent"));
    d.push_context = reinterpret_cast<PushContextFn>(dlsym(lib, "cuCtxPushCurrent_v2"));
    d.pop_context = reinterpret_cast<PopContextFn>(dlsym(lib, "cuCtxPopCurrent_v2"));
    d.alloc = reinterpret_cast<AllocFn>(dlsym(lib, "cuMemAlloc_v2"));
    d.free = reinterpret_cast<FreeFn>(dlsym(lib, "cuMemFree_v2"));
    return d;
  }();
  return driver;
}

absl::Status Missing() {
  return absl::FailedPreconditionError(
      "pyfunc_bridge: an XLA call on a GPU found no CUDA driver "
      "(libcuda.so.1 with cuStreamSynchronize, cuMemcpyAsync, cuMemAlloc and "
      "the context calls) loaded");
}

absl::Status Check(CuResult result, const char* what) {
  if (result == 0) return absl::OkStatus();
  return absl::InternalError(std::string("pyfunc_bridge: ") + what +
                             " failed with CUDA error " + std::to_string(result));
}

}  // namespace

absl::Status GpuSynchronize(void* stream) {
  const Driver& d = GetDriver();
  if (d.synchronize == nullptr) return Missing();
  return Check(d.synchronize(stream), "cuStreamSynchronize");
}

absl::Status GpuCopy(void* dst, const void* src, size_t nbytes, void* stream) {
  const Driver& d = GetDriver();
  if (d.copy == nullptr || d.synchronize == nullptr) return Missing();
  absl::Status s = Check(d.copy(reinterpret_cast<uintptr_t>(dst),
                                reinterpret_cast<uintptr_t>(src), nbytes, stream),
                         "cuMemcpyAsync");
  if (!s.ok()) return s;
  // The source (host memory of Python's) goes when the call returns.
  return GpuSynchronize(stream);
}

absl::Status GpuCopyToOwned(const void* src, size_t nbytes, void* stream,
                            GpuMemory* out) {
  const Driver& d = GetDriver();
  if (d.alloc == nullptr || d.free == nullptr || d.get_context == nullptr ||
      d.push_context == nullptr || d.pop_context == nullptr) {
    return Missing();
  }
  GpuMemory memory;
  absl::Status s = Check(d.get_context(&memory.context), "cuCtxGetCurrent");
  if (!s.ok()) return s;
  s = Check(d.alloc(&memory.pointer, nbytes), "cuMemAlloc");
  if (!s.ok()) return s;
  s = GpuCopy(reinterpret_cast<void*>(memory.pointer), src, nbytes, stream);
  if (!s.ok()) {
    GpuFree(memory);
    return s;
  }
  *out = memory;
  return absl::OkStatus();
}

void GpuFree(const GpuMemory& memory) {
  if (memory.pointer == 0) return;
  const Driver& d = GetDriver();
  // The last reference may go on any thread, where another context (or none)
  // is current.
  if (d.push_context(memory.context) != 0) return;  // leak rather than crash
  d.free(memory.pointer);
  void* popped = nullptr;
  d.pop_context(&popped);
}

}  // namespace pyfunc_bridge
