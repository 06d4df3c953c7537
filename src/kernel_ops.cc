// Op definitions: the bridge ops and their shape function.  Kernels live in
// kernel_numpy_function.cc.
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace pyfunc_bridge {
namespace {

using ::tensorflow::PartialTensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Publishes the shapes declared through Tout=tf.TensorSpec(...); the kernel
// checks them at run time, so downstream shape inference can rely on them.
absl::Status DeclaredOutputShapes(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("out_shapes", &shapes));
  if (shapes.empty()) return tensorflow::shape_inference::UnknownShape(c);
  if (static_cast<int>(shapes.size()) != c->num_outputs()) {
    return absl::InvalidArgumentError(
        "out_shapes has " + std::to_string(shapes.size()) +
        " entries but the op has " + std::to_string(c->num_outputs()) +
        " outputs");
  }
  for (int i = 0; i < c->num_outputs(); ++i) {
    ShapeHandle handle;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &handle));
    c->set_output(i, handle);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pyfunc_bridge

// key:        the registry key of the Python function (module:qualname@id).
// out_shapes: declared output shapes, or [] when none was declared.
// copy:       the copy policy, NumPy 2's tri-state.
#define PFB_REGISTER_BRIDGE_OP(NAME)                              \
  REGISTER_OP(NAME)                                               \
      .Input("input: Tin")                                        \
      .Output("output: Tout")                                     \
      .Attr("key: string")                                        \
      .Attr("Tin: list(type) >= 0")                               \
      .Attr("Tout: list(type) >= 0")                              \
      .Attr("out_shapes: list(shape) = []")                       \
      .Attr("copy: {'none', 'true', 'false'} = 'none'")           \
      .SetShapeFn(::pyfunc_bridge::DeclaredOutputShapes)

PFB_REGISTER_BRIDGE_OP("PyfuncBridge>NumpyFunction").SetIsStateful();
PFB_REGISTER_BRIDGE_OP("PyfuncBridge>NumpyFunctionStateless");
