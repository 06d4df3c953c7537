// Kernels of the numpy_function ops (CPU only: NumPy sees host memory).
#include "bridge.h"

namespace pyfunc_bridge {
namespace {

class NumpyFunctionOp : public BridgeKernel {
 public:
  explicit NumpyFunctionOp(tensorflow::OpKernelConstruction* ctx)
      : BridgeKernel(ctx, -1) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    RunBridge(ctx, 0, 0, nullptr);
  }
};

REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>NumpyFunction").Device(tensorflow::DEVICE_CPU),
    NumpyFunctionOp);
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>NumpyFunctionStateless").Device(tensorflow::DEVICE_CPU),
    NumpyFunctionOp);

}  // namespace
}  // namespace pyfunc_bridge
