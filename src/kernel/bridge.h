// What every bridge kernel shares: TF tensors -> DLPack inputs, the call into
// the conversion layer, DLPack -> TF outputs (wrapped without a copy when the
// memory qualifies).  The numpy_function and py_function kernels build on it.
#ifndef PYFUNC_BRIDGE_KERNEL_BRIDGE_H_
#define PYFUNC_BRIDGE_KERNEL_BRIDGE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bridge_abi.h"
#include "pool_route.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace pyfunc_bridge {

// TF DataType -> DLPack dtype (strings: PFB_STRING_DTYPE_*); InvalidArgument
// for a dtype the bridge does not hand over.
absl::Status ToDLDataType(tensorflow::DataType dtype, DLDataType* out);

// `tensor` as a DLPack tensor (strings as PfbStringRef records) that holds a
// reference on its TF buffer until its deleter runs (no GIL needed);
// `device`: where its memory is.  READ_ONLY, or IS_COPIED when `exclusive`:
// the caller held the only reference to the buffer (bridge_abi.h, inputs).
absl::Status ExportInput(const tensorflow::Tensor& tensor, DLDevice device,
                         DLManagedTensorVersioned** out, bool exclusive = false);

// The TF tensor behind a DLPack tensor that ExportInput made, or nullptr for
// any other producer's.
const tensorflow::Tensor* ExportedTensor(const DLManagedTensorVersioned* managed);

// The op's `copy` attribute ("true", "false", else none) as a PfbCopyMode;
// PFB_COPY_NONE when the op has no such attribute.
absl::Status ReadCopyMode(tensorflow::OpKernelConstruction* ctx, int32_t* mode);

// A kernel that runs the Python function named by its `key` attribute.
// Attributes read when present: key, reference, pickled, framework, Tout (or
// Tdx), out_shapes, copy.  TF sees it as asynchronous only when built with
// `async` (AsAsync): then a call over the kernel's pool route is posted and
// its reply completes the op (ComputeAsync, PostNative); every other call
// runs in ComputeAsync before it returns, as Compute runs it.
class BridgeKernel : public tensorflow::AsyncOpKernel, private NativeContinuation {
 public:
  // `num_bridge_outputs`: the leading outputs that the function produces
  // (-1: all of them).
  BridgeKernel(tensorflow::OpKernelConstruction* ctx, int num_bridge_outputs,
               bool async = false);
  ~BridgeKernel() override;

  tensorflow::AsyncOpKernel* AsAsync() override { return async_ ? this : nullptr; }
  // A numpy_function's call (RunBridge's, without flags or state).
  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override;

 protected:
  // Hands inputs [first_input, num_inputs) to the conversion layer and makes
  // the bridge outputs from its results.  `state` is PfbCall.state (in/out).
  // Returns false (with the status set on ctx) on error.
  bool RunBridge(tensorflow::OpKernelContext* ctx, int first_input,
                 int32_t flags, void** state);

  const std::string& key() const { return key_; }

 private:
  // Whether a call may take the kernel's pool route (docs/pool.md, "A
  // kernel's native call", step 1).
  bool MayRoute(int32_t flags, void** state) const;
  // The call through the conversion layer (the Python path), with the
  // native call's reply when it has one (`native`, or nullptr).
  bool RunPython(tensorflow::OpKernelContext* ctx, int first_input, int32_t flags,
                 void** state, bool may_route, NativeCall* native);
  // A posted call's outcome that needs the Python path (NativeContinuation).
  void Continue(tensorflow::OpKernelContext* ctx, NativeOutcome outcome, NativeCall* call,
                const PfbDispatchRoute* route) override;

  bool async_ = false;
  std::string key_;
  // The portable description (PfbCall.reference, .pickled, .framework).
  std::string reference_;
  std::string pickled_;
  std::string framework_;
  std::string device_name_;
  bool on_gpu_ = false;
  DLDevice device_{kDLCPU, 0};
  int32_t copy_mode_ = PFB_COPY_NONE;
  std::vector<PfbOutputSpec> specs_;
  std::vector<std::vector<int64_t>> dims_;
  // PfbCall.site: what the conversion layer resolved key_ to (a PyObject*,
  // owned; NULL until the first call).  Only the conversion layer touches it,
  // with the GIL held, so concurrent Compute() calls need no lock.
  void* site_ = nullptr;
  // The native route of a kernel whose calls run in a process pool
  // (pool_route.h), once the conversion layer offered one.
  RouteSlot route_;
};

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_BRIDGE_H_
