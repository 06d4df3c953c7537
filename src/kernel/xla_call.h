// The bridge ops under XLA: what the compile-time lowering (xla_ops.cc)
// writes into its custom calls and what the run-time handlers (xla_call.cc)
// read back.  A call to a bridge op becomes one XLA custom call of the typed
// FFI (API_VERSION_TYPED_FFI); its backend_config is an MLIR dictionary of
// the attributes named below.
#ifndef PYFUNC_BRIDGE_KERNEL_XLA_CALL_H_
#define PYFUNC_BRIDGE_KERNEL_XLA_CALL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bridge_abi.h"

namespace tensorflow {
class OpKernel;
class OpKernelConstruction;
}  // namespace tensorflow

namespace pyfunc_bridge {

// Custom-call targets, registered with XLA's FFI for the CPU ("Host") and
// CUDA platforms.  A call's operands are the op's inputs, its results the
// op's outputs (a tuple; one FFI result per element).
inline constexpr char kXlaCallTarget[] = "pyfunc_bridge.call";
// A py_function gradient: operands are the forward site's id (s64[]), the
// forward call's inputs, then the output gradients; results the input
// gradients.  It reruns the forward function under a tape (XLA carries no
// Python object from one custom call to the next).
inline constexpr char kXlaGradientTarget[] = "pyfunc_bridge.gradient";

// The string attributes of kXlaCallTarget (PfbCall fields of the same
// names) and its i32 attributes `copy` (PfbCall.copy_mode) and `flags`
// (PfbCall.flags: PFB_CALL_TENSORS for py_function).  The gradient target
// has `node` and the i32 `inputs` (how many forward inputs follow the id).
inline constexpr const char* kXlaStringAttrs[] = {"key", "reference", "pickled",
                                                   "framework", "node"};

// What a py_function's gradient needs of its forward call, registered when
// the forward op compiles and found by id when the gradient runs.  Sites
// live as long as the process (an XLA program may outlive the kernels that
// compiled it); equal sites share one id, so a retraced function adds none.
struct ForwardSite {
  std::string key;
  std::string reference;
  std::string pickled;
  std::string framework;
  std::string node;
  // The forward outputs' declared dtypes and static shapes.
  std::vector<DLDataType> dtypes;
  std::vector<std::vector<int64_t>> dims;
};

// The ops that have an XLA kernel (xla_ops.cc), and whether it is also
// registered for XLA_GPU_JIT (numpy_function's reads host memory only).
struct XlaKernelSpec {
  const char* op;
  bool gpu;
};
inline constexpr XlaKernelSpec kXlaKernels[] = {
    {"PyfuncBridge>NumpyFunction", false},
    {"PyfuncBridge>NumpyFunctionStateless", false},
    {"PyfuncBridge>ArrayFunction", true},
    {"PyfuncBridge>ArrayFunctionStateless", true},
    {"PyfuncBridge>PyFunction", true},
    {"PyfuncBridge>PyFunctionGrad", true},
};

// A new XLA kernel of the op `ctx` builds (one of kXlaKernels), for
// registrations outside REGISTER_XLA_OP (xla_late.cc).
tensorflow::OpKernel* NewXlaKernel(tensorflow::OpKernelConstruction* ctx);

// The id of `site` (a new one, or that of an equal site already held).
int64_t RegisterForwardSite(ForwardSite site);

// The site of `id`, or nullptr; sites are never removed, so the pointer
// stays valid.
const ForwardSite* FindForwardSite(int64_t id);

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_XLA_CALL_H_
