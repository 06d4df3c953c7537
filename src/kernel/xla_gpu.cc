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

struct Driver {
  SynchronizeFn synchronize = nullptr;
  CopyFn copy = nullptr;
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) return d;
    // The handle stays open: the process keeps the driver anyway.
    d.synchronize = reinterpret_cast<SynchronizeFn>(dlsym(lib, "cuStreamSynchronize"));
    d.copy = reinterpret_cast<CopyFn>(dlsym(lib, "cuMemcpyAsync"));
    return d;
  }();
  return driver;
}

absl::Status Missing() {
  return absl::FailedPreconditionError(
      "pyfunc_bridge: an XLA call on a GPU found no CUDA driver "
      "(libcuda.so.1 with cuStreamSynchronize and cuMemcpyAsync) loaded");
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

}  // namespace pyfunc_bridge
