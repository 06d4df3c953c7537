// Op definitions: the bridge ops and their shape function.  Their kernels live
// in numpy_function.cc and py_function.cc, on the shared bridge.{h,cc}.
#include <vector>

#include "tensorflow/core/framework/attr_value.pb.h"
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

// py_function: the declared shapes of the function's outputs, then the
// scalar forward state.
absl::Status PyFunctionShapes(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("out_shapes", &shapes));
  const int n = c->num_outputs() - 1;
  if (!shapes.empty() && static_cast<int>(shapes.size()) != n) {
    return absl::InvalidArgumentError(
        "out_shapes has " + std::to_string(shapes.size()) +
        " entries but the function has " + std::to_string(n) + " outputs");
  }
  for (int i = 0; i < n; ++i) {
    ShapeHandle handle = c->UnknownShape();
    if (!shapes.empty()) {
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &handle));
    }
    c->set_output(i, handle);
  }
  c->set_output(n, c->Scalar());
  // A call built for XLA (_py_function.py sets the attribute) holds an XLA
  // tuple there, which must not leave its graph: declared not trainable (as
  // _not_trainable does in the building process) wherever the graph is rebuilt
  // from its NodeDefs (a loaded SavedModel), so no gradient asks for its zeros.
  const tensorflow::AttrValue* xla = c->GetAttr("_pyfunc_bridge_xla");
  if (xla != nullptr && xla->b()) {
    c->set_output_handle_shapes_and_types(
        n, {tensorflow::shape_inference::ShapeAndType(c->Scalar(),
                                                      tensorflow::DT_INT32)});
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pyfunc_bridge

// key:        the registry key of the Python function (module:qualname@id).
// reference, pickled, framework: the function's portable description, used
//             where nothing is registered under `key` (another process, or a
//             dropped source graph): "module:qualname" of a function the
//             loading process declared portable, the function serialized by
//             cloudpickle, array_function's framework ("" for NumPy).
// out_shapes: declared output shapes, or [] when none was declared.
// copy:       the copy policy, NumPy 2's tri-state.
#define PFB_PORTABLE_ATTRS                                        \
  Attr("reference: string = ''")                                  \
      .Attr("pickled: string = ''")                               \
      .Attr("framework: string = ''")

#define PFB_REGISTER_BRIDGE_OP(NAME)                              \
  REGISTER_OP(NAME)                                               \
      .Input("input: Tin")                                        \
      .Output("output: Tout")                                     \
      .Attr("key: string")                                        \
      .PFB_PORTABLE_ATTRS                                         \
      .Attr("Tin: list(type) >= 0")                               \
      .Attr("Tout: list(type) >= 0")                              \
      .Attr("out_shapes: list(shape) = []")                       \
      .Attr("copy: {'none', 'true', 'false'} = 'none'")           \
      .SetShapeFn(::pyfunc_bridge::DeclaredOutputShapes)

PFB_REGISTER_BRIDGE_OP("PyfuncBridge>NumpyFunction").SetIsStateful();
PFB_REGISTER_BRIDGE_OP("PyfuncBridge>NumpyFunctionStateless");
// array_function for frameworks that hold device memory (torch, JAX, CuPy):
// the same op, with a GPU kernel too, so GPU tensors reach them in place.
PFB_REGISTER_BRIDGE_OP("PyfuncBridge>ArrayFunction").SetIsStateful();
PFB_REGISTER_BRIDGE_OP("PyfuncBridge>ArrayFunctionStateless");

// py_function: the function receives EagerTensors.  `forward` holds what its
// gradient needs (recorded only when something consumes it).
REGISTER_OP("PyfuncBridge>PyFunction")
    .Input("input: Tin")
    .Output("output: Tout")
    .Output("forward: variant")
    .Attr("key: string")
    .PFB_PORTABLE_ATTRS
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("out_shapes: list(shape) = []")
    .SetIsStateful()
    .SetShapeFn(::pyfunc_bridge::PyFunctionShapes);

// The CUDA stream (its handle) of the GPU the op is placed on (gpu_stream.cc).
REGISTER_OP("PyfuncBridge>GpuStream")
    .Output("stream: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// The gradient of one py_function call: `forward` is that call's forward
// output, `grads` the gradients of its floating outputs, `input_grads` those
// of its floating inputs.
REGISTER_OP("PyfuncBridge>PyFunctionGrad")
    .Input("forward: variant")
    .Input("grads: Tgrad")
    .Output("input_grads: Tdx")
    .Attr("Tgrad: list(type) >= 0")
    .Attr("Tdx: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape);
