// The CUDA driver calls the XLA custom calls make on a GPU (xla_call.cc):
// XLA's FFI hands a handler its CUDA stream, not a StreamExecutor stream,
// so the handler synchronizes and copies through the driver API itself.
#ifndef PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_
#define PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_

#include <cstddef>

#include "absl/status/status.h"

namespace pyfunc_bridge {

// Waits until the work enqueued on `stream` (a CUstream) is done: what the
// GPU kernels do (Stream::BlockHostUntilDone) before Python sees buffers.
absl::Status GpuSynchronize(void* stream);

// Copies `nbytes` from `src` to `dst` (host or device memory, either way:
// unified addressing) on `stream` and waits for the copy.
absl::Status GpuCopy(void* dst, const void* src, size_t nbytes, void* stream);

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_XLA_GPU_H_
