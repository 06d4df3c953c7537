// The op that tells the conversion layer which CUDA stream TF computes on, so
// that DLPack imports can name it to their producer (__dlpack__(stream=...)).
#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "xla/stream_executor/stream.h"

namespace pyfunc_bridge {
namespace {

class GpuStreamOp : public tensorflow::OpKernel {
 public:
  explicit GpuStreamOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &out));
    stream_executor::Stream* stream =
        ctx->op_device_context() != nullptr ? ctx->op_device_context()->stream() : nullptr;
    OP_REQUIRES(ctx, stream != nullptr,
                absl::FailedPreconditionError(
                    "pyfunc_bridge: this GPU device has no compute stream"));
    out->scalar<int64_t>()() =
        reinterpret_cast<intptr_t>(stream->platform_specific_handle().stream);
  }
};

// GPU only: a CPU has no stream to name.
REGISTER_KERNEL_BUILDER(Name("PyfuncBridge>GpuStream")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("stream"),
                        GpuStreamOp);

}  // namespace
}  // namespace pyfunc_bridge
