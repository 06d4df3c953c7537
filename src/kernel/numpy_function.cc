// Kernels of the numpy_function ops (CPU only: NumPy sees host memory) and of
// the array_function ops (CPU and GPU: torch, JAX and CuPy see device memory).
#include "bridge.h"

namespace pyfunc_bridge {
namespace {

// Asynchronous on the CPU when its graph op runs in a process pool (the API
// sets the node attribute _pyfunc_bridge_pool, _op.py): a pool call then
// holds no TF thread while a worker runs it (BridgeKernel::ComputeAsync).
// Other kernels stay synchronous: TF's executor costs an asynchronous
// kernel's every call more (measured: about 5 us per in-process call).
class NumpyFunctionOp : public BridgeKernel {
 public:
  explicit NumpyFunctionOp(tensorflow::OpKernelConstruction* ctx)
      : BridgeKernel(ctx, -1,
                     ctx->device_type() == tensorflow::DEVICE_CPU &&
                         ctx->HasAttr("_pyfunc_bridge_pool")) {}

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
// On a GPU numeric inputs and outputs stay in device memory; strings and int32
// live in host memory as TF places them.
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>ArrayFunction").Device(tensorflow::DEVICE_CPU),
    NumpyFunctionOp);
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>ArrayFunctionStateless").Device(tensorflow::DEVICE_CPU),
    NumpyFunctionOp);
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>ArrayFunction").Device(tensorflow::DEVICE_GPU),
    NumpyFunctionOp);
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>ArrayFunctionStateless").Device(tensorflow::DEVICE_GPU),
    NumpyFunctionOp);

}  // namespace
}  // namespace pyfunc_bridge
