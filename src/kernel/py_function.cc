// Kernels of the py_function ops, for CPU and GPU.  The forward op returns,
// besides the function's results, a scalar variant that holds the recorded
// forward computation; the gradient op takes it back.  Each forward call is
// paired with its gradient through that tensor alone (no table keyed by op or
// token), and the recorded state lives exactly as long as TF keeps the tensor.
#include <memory>
#include <string>
#include <utility>

#include "bridge.h"
#include "python_gil.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_op_registry.h"
#include "tensorflow/core/framework/variant_tensor_data.h"

namespace pyfunc_bridge {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Variant;

// One reference to a Python object, dropped (with the GIL) by the destructor.
class PythonReference {
 public:
  explicit PythonReference(void* object) : object_(object) {}
  ~PythonReference() { DecrefWithGil(object_); }
  PythonReference(const PythonReference&) = delete;
  PythonReference& operator=(const PythonReference&) = delete;
  void* get() const { return object_; }

 private:
  void* object_;
};

// The variant's value.  Copies share the Python state.
struct ForwardState {
  std::shared_ptr<PythonReference> state;

  std::string TypeName() const { return "pyfunc_bridge.ForwardState"; }
  // The state lives in this process only: it encodes to nothing and decodes
  // to an empty state, whose gradient op fails with a clear error.
  void Encode(tensorflow::VariantTensorData* data) const {
    data->set_type_name(TypeName());
  }
  bool Decode(tensorflow::VariantTensorData data) {
    state.reset();
    return true;
  }
  std::string DebugString() const {
    return state ? "ForwardState(recorded)" : "ForwardState(empty)";
  }
};

// Gradient code may ask for zeros of any variant it meets (e.g. while_v2's
// accumulators): the zero of a forward state is an empty one.
absl::Status ZerosLikeForwardState(OpKernelContext*, const ForwardState&,
                                   ForwardState* out) {
  out->state.reset();
  return absl::OkStatus();
}

// TF moves a variant between host and device when a function's output or
// input lives on a GPU (an eager op on a GPU runs as one): the state is a
// host object, so the "copy" shares it.
absl::Status CopyForwardState(
    const ForwardState& from, ForwardState* to,
    tensorflow::UnaryVariantOpRegistry::AsyncTensorDeviceCopyFn) {
  *to = from;
  return absl::OkStatus();
}

class PyFunctionOp : public BridgeKernel {
 public:
  explicit PyFunctionOp(OpKernelConstruction* ctx)
      : BridgeKernel(ctx, ctx->num_outputs() - 1) {}

  void Compute(OpKernelContext* ctx) override {
    const int forward_index = ctx->num_outputs() - 1;
    int32_t flags = PFB_CALL_TENSORS;
    // Only a graph that may run the gradient consumes the forward output
    // (eager kernels always see it required: the op layer decides there).
    const bool record = ctx->output_required(forward_index);
    if (record) flags |= PFB_CALL_RECORD;
    void* state = nullptr;
    const bool ok = RunBridge(ctx, 0, flags, &state);
    // The new reference the conversion layer returned is owned from here on.
    std::shared_ptr<PythonReference> recorded;
    if (state != nullptr) recorded = std::make_shared<PythonReference>(state);
    // An output nothing consumes may stay unset (TF's executors allow it):
    // a call that records nothing makes no forward tensor.
    if (!ok || !record) return;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(forward_index, TensorShape({}), &out));
    out->scalar<Variant>()() = ForwardState{std::move(recorded)};
  }
};

class PyFunctionGradOp : public BridgeKernel {
 public:
  explicit PyFunctionGradOp(OpKernelConstruction* ctx)
      : BridgeKernel(ctx, -1) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& forward = ctx->input(0);
    OP_REQUIRES(ctx, forward.dims() == 0,
                absl::InvalidArgumentError(
                    "pyfunc_bridge: the forward input of a py_function "
                    "gradient must be a scalar"));
    // `forward` (an input) keeps the state alive for the whole call.
    const ForwardState* recorded = forward.scalar<Variant>()().get<ForwardState>();
    OP_REQUIRES(
        ctx, recorded != nullptr && recorded->state != nullptr,
        absl::FailedPreconditionError(
            "pyfunc_bridge: this py_function call recorded no forward state "
            "for its gradient (the forward call ran where no gradient was "
            "requested, or its state came from another process)"));
    void* state = recorded->state->get();
    RunBridge(ctx, 1, PFB_CALL_TENSORS | PFB_CALL_GRADIENT, &state);
  }
};

REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>PyFunction").Device(tensorflow::DEVICE_CPU),
    PyFunctionOp);
REGISTER_KERNEL_BUILDER(
    Name("PyfuncBridge>PyFunctionGrad").Device(tensorflow::DEVICE_CPU),
    PyFunctionGradOp);
// On a GPU, numeric inputs and outputs stay in device memory; strings and
// int32 live in host memory as TF places them; the forward state (a C++
// object) always does.
REGISTER_KERNEL_BUILDER(Name("PyfuncBridge>PyFunction")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("forward"),
                        PyFunctionOp);
REGISTER_KERNEL_BUILDER(Name("PyfuncBridge>PyFunctionGrad")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("forward"),
                        PyFunctionGradOp);

}  // namespace
}  // namespace pyfunc_bridge

namespace tensorflow {  // the registration macro names TF's types unqualified
REGISTER_UNARY_VARIANT_UNARY_OP_FUNCTION(ZEROS_LIKE_VARIANT_UNARY_OP,
                                         DEVICE_CPU,
                                         ::pyfunc_bridge::ForwardState,
                                         ::pyfunc_bridge::ZerosLikeForwardState);
REGISTER_UNARY_VARIANT_UNARY_OP_FUNCTION(ZEROS_LIKE_VARIANT_UNARY_OP,
                                         DEVICE_GPU,
                                         ::pyfunc_bridge::ForwardState,
                                         ::pyfunc_bridge::ZerosLikeForwardState);
INTERNAL_REGISTER_UNARY_VARIANT_DEVICE_COPY_FUNCTION(
    ::pyfunc_bridge::ForwardState, VariantDeviceCopyDirection::HOST_TO_DEVICE,
    ::pyfunc_bridge::CopyForwardState);
INTERNAL_REGISTER_UNARY_VARIANT_DEVICE_COPY_FUNCTION(
    ::pyfunc_bridge::ForwardState, VariantDeviceCopyDirection::DEVICE_TO_HOST,
    ::pyfunc_bridge::CopyForwardState);
INTERNAL_REGISTER_UNARY_VARIANT_DEVICE_COPY_FUNCTION(
    ::pyfunc_bridge::ForwardState, VariantDeviceCopyDirection::DEVICE_TO_DEVICE,
    ::pyfunc_bridge::CopyForwardState);
}  // namespace tensorflow
