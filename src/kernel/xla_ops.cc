// The bridge ops' XLA kernels: compile-time lowering of each op to one XLA
// custom call of the typed FFI (xla_call.h), whose handlers run the call
// through the conversion layer at run time (xla_call.cc).
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "bridge.h"
#include "tensorflow/compiler/tf2xla/type_util.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "xla_call.h"

namespace pyfunc_bridge {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::XlaOpKernelContext;

// `bytes` as an MLIR string literal: printable ASCII as it is, every other
// byte (and the quote and backslash) as \HH, which MLIR's lexer decodes.
std::string MlirString(std::string_view bytes) {
  std::string out = "\"";
  out.reserve(bytes.size() + 2);
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "\\%02X", c);
      out += hex;
    }
  }
  return out + "\"";
}

// The custom call's backend_config: an MLIR dictionary (the typed FFI's
// attributes).
class MlirAttributes {
 public:
  void String(const char* name, std::string_view value) {
    Add(name, MlirString(value));
  }
  void Int32(const char* name, int32_t value) {
    Add(name, std::to_string(value) + " : i32");
  }
  std::string Done() const { return "{" + body_ + "}"; }

 private:
  void Add(const char* name, const std::string& value) {
    if (!body_.empty()) body_ += ", ";
    body_ += std::string(name) + " = " + value;
  }
  std::string body_;
};

// Row-major: the layout the FFI handlers assume (DLPack's strides == NULL).
absl::StatusOr<xla::Shape> RowMajor(xla::PrimitiveType type,
                                    absl::Span<const int64_t> dims) {
  return xla::ShapeUtil::MakeShapeWithDescendingLayout(type, dims);
}

// The op's inputs, each with its static shape (row-major).
absl::Status StaticInputs(XlaOpKernelContext* ctx, int first,
                          std::vector<xla::XlaOp>* ops,
                          std::vector<xla::Shape>* shapes) {
  for (int i = first; i < ctx->num_inputs(); ++i) {
    TF_ASSIGN_OR_RETURN(xla::Shape shape, ctx->InputXlaShape(i));
    if (!shape.is_static() || !shape.IsArray()) {
      return absl::InvalidArgumentError(
          "pyfunc_bridge: node '" + ctx->op_kernel().name() + "': input " +
          std::to_string(i - first) + " has the dynamic shape " +
          shape.ToString() + "; XLA hands the function static shapes only");
    }
    TF_ASSIGN_OR_RETURN(shape, RowMajor(shape.element_type(), shape.dimensions()));
    ops->push_back(ctx->Input(i));
    shapes->push_back(std::move(shape));
  }
  return absl::OkStatus();
}

xla::XlaOp FfiCall(XlaOpKernelContext* ctx, const char* target,
                   absl::Span<const xla::XlaOp> operands,
                   absl::Span<const xla::Shape> operand_shapes,
                   absl::Span<const xla::Shape> results,
                   const std::string& config, bool has_side_effect) {
  return xla::CustomCallWithLayout(
      ctx->builder(), target, operands,
      xla::ShapeUtil::MakeTupleShape(results), operand_shapes, config,
      has_side_effect, /*output_operand_aliasing=*/{}, /*literal=*/nullptr,
      xla::CustomCallSchedule::SCHEDULE_NONE,
      xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
}

// numpy_function, py_func, array_function and py_function: one custom call
// to kXlaCallTarget.  py_function's last output (its forward state, a
// variant) becomes a tuple (site id, the inputs...) for its gradient.
class XlaBridgeOp : public tensorflow::XlaOpKernel {
 public:
  explicit XlaBridgeOp(OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    for (auto [name, value] : {std::pair{"reference", &reference_},
                               std::pair{"pickled", &pickled_},
                               std::pair{"framework", &framework_}}) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, value));
    }
    OP_REQUIRES_OK(ctx, ReadCopyMode(ctx, &copy_mode_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("out_shapes", &shapes_));
    const std::string& type = ctx->def().op();
    tensors_ = type == "PyfuncBridge>PyFunction";
    // Stateful ops (all but the *Stateless ones, ops.cc) are side-effecting
    // custom calls: XLA neither merges two of them nor drops one whose
    // results go unused.
    side_effect_ = !absl::EndsWith(type, "Stateless");
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const int n = ctx->num_outputs() - (tensors_ ? 1 : 0);
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> operand_shapes;
    OP_REQUIRES_OK(ctx, StaticInputs(ctx, 0, &operands, &operand_shapes));
    std::vector<xla::Shape> results;
    ForwardSite site;
    for (int i = 0; i < n; ++i) {
      const PartialTensorShape declared =
          shapes_.empty() ? PartialTensorShape() : shapes_[i];
      OP_REQUIRES_OK(ctx, CheckDeclared(ctx, i, declared));
      xla::PrimitiveType type;
      OP_REQUIRES_OK(ctx, tensorflow::DataTypeToPrimitiveType(
                              ctx->expected_output_dtype(i), &type));
      auto shape = RowMajor(type, declared.dim_sizes());
      OP_REQUIRES_OK(ctx, shape.status());
      results.push_back(*std::move(shape));
      DLDataType dtype;
      OP_REQUIRES_OK(ctx, ToDLDataType(ctx->expected_output_dtype(i), &dtype));
      site.dtypes.push_back(dtype);
      const auto sizes = declared.dim_sizes();  // a copy: iterate one object
      site.dims.emplace_back(sizes.begin(), sizes.end());
    }
    MlirAttributes attrs;
    attrs.String("key", key_);
    attrs.String("reference", reference_);
    attrs.String("pickled", pickled_);
    attrs.String("framework", framework_);
    attrs.String("node", ctx->op_kernel().name());
    attrs.Int32("copy", copy_mode_);
    attrs.Int32("flags", tensors_ ? PFB_CALL_TENSORS : 0);
    xla::XlaOp call = FfiCall(ctx, kXlaCallTarget, operands, operand_shapes,
                              results, attrs.Done(), side_effect_);
    for (int i = 0; i < n; ++i) ctx->SetOutput(i, xla::GetTupleElement(call, i));
    if (!tensors_) return;
    site.key = key_;
    site.reference = reference_;
    site.pickled = pickled_;
    site.framework = framework_;
    site.node = ctx->op_kernel().name();
    std::vector<xla::XlaOp> forward = {
        xla::ConstantR0<int64_t>(ctx->builder(), RegisterForwardSite(std::move(site)))};
    forward.insert(forward.end(), operands.begin(), operands.end());
    ctx->SetOutput(n, xla::Tuple(ctx->builder(), forward));
  }

 private:
  // XLA compiles static shapes: every output's must be declared in full.
  static absl::Status CheckDeclared(XlaOpKernelContext* ctx, int index,
                                    const PartialTensorShape& declared) {
    if (declared.IsFullyDefined()) return absl::OkStatus();
    const std::string what =
        declared.unknown_rank()
            ? "declares no shape"
            : "declares the shape " + declared.DebugString() +
                  ", with unknown dimensions";
    return absl::InvalidArgumentError(
        "pyfunc_bridge: " + ctx->op_kernel().type_string() + " node '" +
        ctx->op_kernel().name() + "' cannot compile with XLA: its output " +
        std::to_string(index) + " " + what +
        ". XLA needs the shape of every output when it compiles, before the "
        "function runs: declare it in Tout, Tout=tf.TensorSpec(shape, dtype) "
        "(e.g. tf.TensorSpec([8, 4], tf.float32)). A dimension that is only "
        "known when the function runs (None, e.g. a batch dimension) cannot "
        "be compiled: give the function a fixed shape, or run it outside the "
        "jit_compile=True function");
  }

  std::string key_;
  std::string reference_;
  std::string pickled_;
  std::string framework_;
  int32_t copy_mode_ = PFB_COPY_NONE;
  std::vector<PartialTensorShape> shapes_;
  bool tensors_ = false;
  bool side_effect_ = true;
};

bool IsFloating(xla::PrimitiveType type) {
  return xla::primitive_util::IsFloatingPointType(type) ||
         xla::primitive_util::IsComplexType(type);
}

// py_function's gradient: one custom call to kXlaGradientTarget over the
// forward tuple's elements and the output gradients.
class XlaBridgeGradOp : public tensorflow::XlaOpKernel {
 public:
  explicit XlaBridgeGradOp(OpKernelConstruction* ctx) : XlaOpKernel(ctx) {}

  void Compile(XlaOpKernelContext* ctx) override {
    xla::XlaBuilder* b = ctx->builder();
    const xla::XlaOp forward = ctx->Input(0);
    auto forward_shape = b->GetShape(forward);
    OP_REQUIRES_OK(ctx, forward_shape.status());
    const xla::Shape& fs = *forward_shape;
    OP_REQUIRES(ctx,
                fs.IsTuple() && fs.tuple_shapes().size() >= 1 &&
                    fs.tuple_shapes(0).element_type() == xla::S64,
                absl::InvalidArgumentError(
                    "pyfunc_bridge: node '" + name() +
                    "': the forward input of a py_function gradient under XLA "
                    "must come from a py_function compiled in the same XLA "
                    "program"));
    const int num_forward = static_cast<int>(fs.tuple_shapes().size()) - 1;
    std::vector<xla::XlaOp> operands = {xla::GetTupleElement(forward, 0)};
    std::vector<xla::Shape> operand_shapes = {fs.tuple_shapes(0)};
    std::vector<xla::Shape> results;
    for (int i = 0; i < num_forward; ++i) {
      const xla::Shape& s = fs.tuple_shapes(i + 1);
      operands.push_back(xla::GetTupleElement(forward, i + 1));
      operand_shapes.push_back(s);
      if (IsFloating(s.element_type())) results.push_back(s);
    }
    OP_REQUIRES(ctx, static_cast<int>(results.size()) == ctx->num_outputs(),
                absl::InternalError(
                    "pyfunc_bridge: node '" + name() + "' has " +
                    std::to_string(ctx->num_outputs()) +
                    " input gradients for " + std::to_string(results.size()) +
                    " floating forward inputs"));
    OP_REQUIRES_OK(ctx, StaticInputs(ctx, 1, &operands, &operand_shapes));
    MlirAttributes attrs;
    attrs.String("node", name());
    attrs.Int32("inputs", num_forward);
    // Side-effecting: it reruns the user's function, as the forward did.
    xla::XlaOp call = FfiCall(ctx, kXlaGradientTarget, operands, operand_shapes,
                              results, attrs.Done(), /*has_side_effect=*/true);
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      ctx->SetOutput(i, xla::GetTupleElement(call, i));
    }
  }
};

using ::tensorflow::DEVICE_CPU_XLA_JIT;
using ::tensorflow::DEVICE_GPU_XLA_JIT;

// numpy_function sees host memory only: its XLA kernel is the CPU's, as its
// TF kernel is.  array_function and py_function take device memory too.
REGISTER_XLA_OP(Name("PyfuncBridge>NumpyFunction").Device(DEVICE_CPU_XLA_JIT),
                XlaBridgeOp);
REGISTER_XLA_OP(
    Name("PyfuncBridge>NumpyFunctionStateless").Device(DEVICE_CPU_XLA_JIT),
    XlaBridgeOp);
REGISTER_XLA_OP(Name("PyfuncBridge>ArrayFunction")
                    .Device({DEVICE_CPU_XLA_JIT, DEVICE_GPU_XLA_JIT}),
                XlaBridgeOp);
REGISTER_XLA_OP(Name("PyfuncBridge>ArrayFunctionStateless")
                    .Device({DEVICE_CPU_XLA_JIT, DEVICE_GPU_XLA_JIT}),
                XlaBridgeOp);
REGISTER_XLA_OP(Name("PyfuncBridge>PyFunction")
                    .Device({DEVICE_CPU_XLA_JIT, DEVICE_GPU_XLA_JIT})
                    .AllowVariantTypes(),
                XlaBridgeOp);
REGISTER_XLA_OP(Name("PyfuncBridge>PyFunctionGrad")
                    .Device({DEVICE_CPU_XLA_JIT, DEVICE_GPU_XLA_JIT})
                    .AllowVariantTypes(),
                XlaBridgeGradOp);

}  // namespace

tensorflow::OpKernel* NewXlaKernel(tensorflow::OpKernelConstruction* ctx) {
  if (ctx->def().op() == "PyfuncBridge>PyFunctionGrad") return new XlaBridgeGradOp(ctx);
  return new XlaBridgeOp(ctx);
}

}  // namespace pyfunc_bridge
