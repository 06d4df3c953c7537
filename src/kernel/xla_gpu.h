// The CUDA driver calls the XLA custom calls make on a GPU (xla_call.cc):
// XLA's FFI hands a handler its CUDA stream, not a StreamExecutor stream,
// so the handler synchronizes and copies through the driver API itself.
#ifndef PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_
#define PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace pyfunc_bridge {

// Waits until the work enqueued on `stream` (a CUstream) is done: what the
// GPU kernels do (Stream::BlockHostUntilDone) before Python sees buffers.
absl::Status GpuSynchronize(void* stream);

// Copies `nbytes` from `src` to `dst` (host or device memory, either way:
// unified addressing) on `stream` and waits for the copy.
absl::Status GpuCopy(void* dst, const void* src, size_t nbytes, void* stream);

// Device memory the kernel allocated (cuMemAlloc), with the context it
// belongs to; pointer 0 is none.
struct GpuMemory {
  uintptr_t pointer = 0;
  void* context = nullptr;  // a CUcontext
};

// A copy of `nbytes` of device memory at `src` in new memory of the current
// context (*out, the caller's to GpuFree), made on `stream`, waited for.
absl::Status GpuCopyToOwned(const void* src, size_t nbytes, void* stream,
                            GpuMemory* out);

// Frees `memory` (none: nothing), on any thread: it makes the memory's
// context current for the call.
void GpuFree(const GpuMemory& memory);

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_
