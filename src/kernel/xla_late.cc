// The bridge ops' XLA kernels for a process that compiled with XLA before
// this library loaded.  tf2xla turns the REGISTER_XLA_OP registrations into
// kernels of the JIT devices once per process, at its first compilation
// (XlaOpRegistry::RegisterCompilationKernels); registrations made after that
// are never turned into kernels, and the ops would fail to compile ("No
// registered OpKernel for XLA_CPU_JIT").  Here they are registered as those
// kernels directly, where that first compilation has happened already.
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "xla_call.h"

namespace pyfunc_bridge {
namespace {

// Whether tf2xla has registered its JIT kernels on `device` (NoOp has one
// on every JIT device once it has).
bool JitKernelsRegistered(const char* device) {
  tensorflow::NodeDef node;
  node.set_name("pyfunc_bridge_probe");
  node.set_op("NoOp");
  return tensorflow::KernelDefAvailable(tensorflow::DeviceType(device), node);
}

[[maybe_unused]] const bool kRegisteredLate = [] {
  for (const XlaKernelSpec& spec : kXlaKernels) {
    for (const char* device : {"XLA_CPU_JIT", "XLA_GPU_JIT"}) {
      if (!spec.gpu && device[4] == 'G') continue;
      if (!JitKernelsRegistered(device)) continue;  // REGISTER_XLA_OP's will be used
      // Lives as long as the process, as every kernel registration does.
      new tensorflow::kernel_factory::OpKernelRegistrar(
          tensorflow::KernelDefBuilder(spec.op).Device(device).Build(),
          "XlaBridgeOp", NewXlaKernel);
    }
  }
  return true;
}();

}  // namespace
}  // namespace pyfunc_bridge
