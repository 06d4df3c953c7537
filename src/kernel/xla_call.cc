// The run-time half of the bridge ops under XLA (xla_call.h): the typed-FFI
// handlers of the custom calls.  Each hands copies of XLA's input buffers to
// the conversion layer's driver (the same call the TF kernels make,
// bridge.cc) as DLPack tensors the call owns, and copies the results into
// XLA's output buffers.
#include "xla_call.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "dtype_table.h"
#include "python_gil.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/platform/errors.h"
#include "xla/ffi/api/ffi.h"
#include "xla_gpu.h"

namespace pyfunc_bridge {

namespace ffi = ::xla::ffi;

namespace {

// ----------------------------------------------------------------- buffers --

// The rows of the dtype table (dtype_table.h) are numbers, so that the pool
// module needs neither TF's nor DLPack's headers: checked here, once.
#define PFB_CHECK_ROW_(name, tf, dt, xla, code, bits, kind) \
  static_assert(tensorflow::DT_##dt == (tf), #name);
PFB_DTYPES(PFB_CHECK_ROW_)
#undef PFB_CHECK_ROW_
static_assert(tensorflow::DT_STRING == PFB_TF_DT_STRING, "string");
static_assert(kDLInt == PFB_DL_INT && kDLUInt == PFB_DL_UINT && kDLFloat == PFB_DL_FLOAT &&
                  kDLOpaqueHandle == PFB_DL_OPAQUE_HANDLE && kDLBfloat == PFB_DL_BFLOAT &&
                  kDLComplex == PFB_DL_COMPLEX && kDLBool == PFB_DL_BOOL,
              "DLPack's codes");

// XLA element type -> DLPack dtype, by the dtype table's XLA column.
absl::Status ToDLDataType(ffi::DataType type, DLDataType* out) {
  int row;
  switch (type) {
#define PFB_XLA_CASE_(name, tf, dt, xla, code, bits, kind) \
  case ffi::DataType::xla: row = PFB_DTYPE_##dt; break;
    PFB_DTYPES(PFB_XLA_CASE_)
#undef PFB_XLA_CASE_
    default:
      return absl::InvalidArgumentError(
          "pyfunc_bridge: XLA buffer of element type " +
          std::to_string(static_cast<int>(type)) + ", which the bridge does not hand over");
  }
  *out = DLDataType{pfb_dtypes[row].code, pfb_dtypes[row].bits, 1};
  return absl::OkStatus();
}

// One XLA buffer: XLA owns its memory for the duration of the call.
struct Buffer {
  void* data;
  DLDataType dtype;
  std::vector<int64_t> dims;
  size_t nbytes;
};

absl::Status ToBuffer(const ffi::AnyBuffer& b, Buffer* out) {
  TF_RETURN_IF_ERROR(ToDLDataType(b.element_type(), &out->dtype));
  out->data = b.untyped_data();
  out->dims.assign(b.dimensions().begin(), b.dimensions().end());
  out->nbytes = b.size_bytes();
  return absl::OkStatus();
}

// Where the call's buffers live, and the stream XLA computes on (GPU).
struct Place {
  DLDevice device;
  void* stream;  // a CUstream, or nullptr on the CPU
  std::string device_name;
};

// One input of the call, in memory the kernel owns: a copy of XLA's buffer,
// freed by the DLPack deleter when the last Python reference to it goes.
// XLA reuses its buffers once the call returns, and a function may keep what
// it was given (a global, a thread, an EagerTensor), so the function never
// sees XLA's own memory (design.md, "The life of a call under XLA").
struct OwnedInput {
  DLManagedTensorVersioned managed;
  std::vector<int64_t> shape;
  void* host = nullptr;  // the copy on the CPU (aligned_alloc), owned
  GpuMemory device;      // the copy on a GPU, owned
};

void DeleteOwnedInput(DLManagedTensorVersioned* managed) {
  auto* input = static_cast<OwnedInput*>(managed->manager_ctx);
  std::free(input->host);
  GpuFree(input->device);
  delete input;
}

absl::Status CopyInput(const Buffer& b, const Place& place,
                       DLManagedTensorVersioned** out) {
  auto input = std::make_unique<OwnedInput>();
  void* data = nullptr;
  if (b.nbytes > 0 && place.device.device_type == kDLCPU) {
    // aligned_alloc wants a multiple of the alignment.
    const size_t size = (b.nbytes + PFB_TENSOR_ALIGNMENT - 1) /
                        PFB_TENSOR_ALIGNMENT * PFB_TENSOR_ALIGNMENT;
    input->host = std::aligned_alloc(PFB_TENSOR_ALIGNMENT, size);
    if (input->host == nullptr) {
      return absl::ResourceExhaustedError(
          "pyfunc_bridge: cannot allocate " + std::to_string(b.nbytes) +
          " bytes for a copy of an XLA input");
    }
    std::memcpy(input->host, b.data, b.nbytes);
    data = input->host;
  } else if (b.nbytes > 0) {
    TF_RETURN_IF_ERROR(GpuCopyToOwned(b.data, b.nbytes, place.stream, &input->device));
    data = reinterpret_cast<void*>(input->device.pointer);
  }
  input->shape = b.dims;
  DLManagedTensorVersioned& m = input->managed;
  m.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m.manager_ctx = input.get();
  m.deleter = DeleteOwnedInput;
  // The call's alone (bridge_abi.h, inputs): the function may write it.
  m.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  DLTensor& t = m.dl_tensor;
  t.data = data;
  t.device = place.device;
  t.ndim = static_cast<int32_t>(input->shape.size());
  t.dtype = b.dtype;
  t.shape = input->shape.data();
  t.strides = nullptr;  // row-major: the layout xla_ops.cc asks for
  t.byte_offset = 0;
  *out = &input.release()->managed;
  return absl::OkStatus();
}

// Owns the conversion layer's results until they are copied; GIL held.
struct Results {
  absl::InlinedVector<DLManagedTensorVersioned*, 8> tensors;
  ~Results() { Release(); }
  void Release() {
    for (auto*& m : tensors) {
      if (m != nullptr && m->deleter != nullptr) m->deleter(m);
      m = nullptr;
    }
  }
};

// Copies result `index` into XLA's buffer `out`, after checking that it is
// exactly what the buffer holds (never writes past it).
absl::Status CopyResult(int index, const DLManagedTensorVersioned* managed,
                        const Buffer& out, const Place& place) {
  auto where = [index] { return "pyfunc_bridge: output " + std::to_string(index); };
  if (managed == nullptr) {
    return absl::InternalError(where() + ": the conversion layer returned no tensor");
  }
  const DLTensor& t = managed->dl_tensor;
  if (t.dtype.code != out.dtype.code || t.dtype.bits != out.dtype.bits ||
      t.dtype.lanes != 1) {
    return absl::InternalError(where() + " came back with the wrong DLPack dtype");
  }
  if (t.ndim != static_cast<int32_t>(out.dims.size()) ||
      (t.ndim > 0 && (t.shape == nullptr ||
                      !std::equal(out.dims.begin(), out.dims.end(), t.shape)))) {
    return absl::InternalError(where() + " came back with another shape than XLA's buffer");
  }
  if (out.nbytes == 0) return absl::OkStatus();
  if (t.strides != nullptr) {
    return absl::InternalError(where() + " came back with strides");
  }
  const char* data = static_cast<const char*>(t.data) + t.byte_offset;
  if (place.device.device_type == kDLCPU) {
    if (t.device.device_type != kDLCPU) {
      return absl::InternalError(where() + " came back in device memory for the CPU");
    }
    std::memcpy(out.data, data, out.nbytes);
    return absl::OkStatus();
  }
  return GpuCopy(out.data, data, out.nbytes, place.stream);
}

std::unordered_map<std::string, void*>& SiteSlots() {
  // key -> PfbCall.site, touched with the GIL held only; never destroyed
  // (the slots hold Python objects, released by no one at exit).
  static auto* slots = new std::unordered_map<std::string, void*>;
  return *slots;
}

// What the custom call's attributes say about the function.
struct Function {
  std::string_view key, reference, pickled, framework, node;
  int32_t copy_mode = PFB_COPY_NONE;
  int32_t flags = 0;
};

// One call of the conversion layer's driver over XLA buffers.  With `state`
// set, PfbCall.state goes in and out (a py_function's recorded forward
// call); `copy_out`: whether the results go to `outs` (false: they are
// dropped, the forward rerun of a gradient).
absl::Status Run(const Function& f, const std::vector<Buffer>& ins,
                 const std::vector<Buffer>& outs, const Place& place,
                 int32_t flags, void** state, bool copy_out = true) {
  absl::InlinedVector<DLManagedTensorVersioned*, 8> inputs;
  auto fail = [&](const absl::Status& s) {
    for (auto* m : inputs) m->deleter(m);  // our own copies: no Python
    return s;
  };
  for (const Buffer& b : ins) {
    DLManagedTensorVersioned* input = nullptr;
    if (absl::Status s = CopyInput(b, place, &input); !s.ok()) return fail(s);
    inputs.push_back(input);
  }
  std::vector<PfbOutputSpec> specs(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    specs[i].dtype = outs[i].dtype;
    specs[i].ndim = static_cast<int32_t>(outs[i].dims.size());
    specs[i].dims = outs[i].dims.data();
    specs[i].device = place.device;
  }
  GilScope gil;
  if (!gil.ok()) {
    return fail(absl::CancelledError(
        "pyfunc_bridge: the Python interpreter is not running (it is "
        "shutting down); the function for key '" + std::string(f.key) +
        "' was not run"));
  }
  const PfbBridgeApi* api = nullptr;
  if (absl::Status s = GetBridgeApi(&api); !s.ok()) return fail(s);

  Results results;
  results.tensors.assign(outs.size(), nullptr);
  PfbCall call{};
  call.key = f.key.data();
  call.key_len = f.key.size();
  call.copy_mode = f.copy_mode;
  call.flags = flags | (GilScope::OnWorkerThread() ? PFB_CALL_WORKER_THREAD : 0);
  call.num_inputs = static_cast<int32_t>(inputs.size());
  call.inputs = inputs.data();
  call.num_outputs = static_cast<int32_t>(outs.size());
  call.output_specs = specs.data();
  call.outputs = results.tensors.data();
  call.device_name = place.device_name.c_str();
  call.stream = place.stream;
  call.state = state != nullptr ? *state : nullptr;
  call.reference = f.reference.data();
  call.reference_len = f.reference.size();
  call.pickled = f.pickled.data();
  call.pickled_len = f.pickled.size();
  call.framework = f.framework.data();
  call.framework_len = f.framework.size();
  call.eager = nullptr;  // XLA's buffers are no TF tensors: EagerTensors via DLPack
  call.site = (flags & PFB_CALL_GRADIENT) ? nullptr : &SiteSlots()[std::string(f.key)];
  call.node_name = f.node.data();
  call.node_name_len = f.node.size();
  call.route = nullptr;
  call.reply = nullptr;
  PfbStatus status{0, nullptr};
  api->call(&call, &status);  // consumes the inputs, on every path
  if (state != nullptr) *state = call.state;  // the caller's, on error too
  if (status.code != 0) {
    std::string message = status.message ? status.message : "(no message)";
    std::free(status.message);
    return absl::Status(static_cast<absl::StatusCode>(status.code), message);
  }
  std::free(status.message);
  if (copy_out) {
    for (size_t i = 0; i < outs.size(); ++i) {
      TF_RETURN_IF_ERROR(CopyResult(static_cast<int>(i), results.tensors[i],
                                    outs[i], place));
    }
  }
  return absl::OkStatus();
}

absl::Status Buffers(ffi::RemainingArgs args, size_t first, size_t count,
                     std::vector<Buffer>* out) {
  for (size_t i = first; i < first + count; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return absl::InternalError(b.error().message());
    out->emplace_back();
    TF_RETURN_IF_ERROR(ToBuffer(*b, &out->back()));
  }
  return absl::OkStatus();
}

absl::Status Buffers(ffi::RemainingRets rets, std::vector<Buffer>* out) {
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return absl::InternalError(b.error().message());
    out->emplace_back();
    TF_RETURN_IF_ERROR(ToBuffer(**b, &out->back()));
  }
  return absl::OkStatus();
}

ffi::Error ToError(const absl::Status& s) {
  if (s.ok()) return ffi::Error::Success();
  return ffi::Error(static_cast<XLA_FFI_Error_Code>(s.code()), std::string(s.message()));
}

Place HostPlace() {
  return Place{DLDevice{kDLCPU, 0}, nullptr,
               "/job:localhost/replica:0/task:0/device:CPU:0"};
}

Place GpuPlace(void* stream, int32_t ordinal) {
  return Place{DLDevice{kDLCUDA, ordinal}, stream,
               "/job:localhost/replica:0/task:0/device:GPU:" + std::to_string(ordinal)};
}

// ---------------------------------------------------------------- handlers --

absl::Status CallImpl(const Place& place, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, const Function& f) {
  std::vector<Buffer> ins, outs;
  TF_RETURN_IF_ERROR(Buffers(args, 0, args.size(), &ins));
  TF_RETURN_IF_ERROR(Buffers(rets, &outs));
  if (place.stream != nullptr) {
    // Python's frameworks do not order their work after XLA's stream: the
    // inputs must be complete before the function sees them.
    TF_RETURN_IF_ERROR(GpuSynchronize(place.stream));
  }
  return Run(f, ins, outs, place, f.flags, nullptr);
}

// Reruns the forward call under a tape (PFB_CALL_RECORD), then its gradient
// (PFB_CALL_GRADIENT) from the state it recorded; the state, which holds
// EagerTensors over copies of the inputs, is dropped before returning.
absl::Status GradientImpl(const Place& place, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, std::string_view node,
                          int32_t num_forward) {
  auto id = args.get<ffi::AnyBuffer>(0);
  if (!id.has_value()) return absl::InternalError(id.error().message());
  int64_t site_id = -1;
  if (place.stream != nullptr) {
    TF_RETURN_IF_ERROR(GpuSynchronize(place.stream));
    TF_RETURN_IF_ERROR(GpuCopy(&site_id, id->untyped_data(), sizeof(site_id),
                               place.stream));
  } else {
    std::memcpy(&site_id, id->untyped_data(), sizeof(site_id));
  }
  const ForwardSite* site = FindForwardSite(site_id);
  if (site == nullptr) {
    return absl::InternalError("pyfunc_bridge: node '" + std::string(node) +
                               "': no py_function forward site " +
                               std::to_string(site_id));
  }
  std::vector<Buffer> forward_ins, grads, outs;
  TF_RETURN_IF_ERROR(Buffers(args, 1, num_forward, &forward_ins));
  TF_RETURN_IF_ERROR(Buffers(args, 1 + num_forward, args.size() - 1 - num_forward, &grads));
  TF_RETURN_IF_ERROR(Buffers(rets, &outs));
  // The forward's results are made and dropped (no XLA buffer holds them).
  std::vector<Buffer> forward_outs(site->dtypes.size());
  for (size_t i = 0; i < forward_outs.size(); ++i) {
    forward_outs[i] = Buffer{nullptr, site->dtypes[i], site->dims[i], 0};
  }
  Function f{site->key, site->reference, site->pickled, site->framework, site->node};
  void* state = nullptr;
  absl::Status s = Run(f, forward_ins, forward_outs, place,
                       PFB_CALL_TENSORS | PFB_CALL_RECORD, &state, /*copy_out=*/false);
  if (s.ok() && state == nullptr) {
    s = absl::InternalError("pyfunc_bridge: node '" + std::string(node) +
                            "': the forward rerun recorded no state");
  }
  if (s.ok()) {
    Function g{site->key, "", "", "", node};
    s = Run(g, grads, outs, place, PFB_CALL_TENSORS | PFB_CALL_GRADIENT, &state);
  }
  DecrefWithGil(state);
  return s;
}

ffi::Error HostCall(ffi::RemainingArgs args, ffi::RemainingRets rets,
                    std::string_view key, std::string_view reference,
                    std::string_view pickled, std::string_view framework,
                    std::string_view node, int32_t copy, int32_t flags) {
  return ToError(CallImpl(HostPlace(), args, rets,
                          Function{key, reference, pickled, framework, node, copy, flags}));
}

ffi::Error GpuCall(void* stream, int32_t ordinal, ffi::RemainingArgs args,
                   ffi::RemainingRets rets, std::string_view key,
                   std::string_view reference, std::string_view pickled,
                   std::string_view framework, std::string_view node,
                   int32_t copy, int32_t flags) {
  return ToError(CallImpl(GpuPlace(stream, ordinal), args, rets,
                          Function{key, reference, pickled, framework, node, copy, flags}));
}

ffi::Error HostGradient(ffi::RemainingArgs args, ffi::RemainingRets rets,
                        std::string_view node, int32_t inputs) {
  return ToError(GradientImpl(HostPlace(), args, rets, node, inputs));
}

ffi::Error GpuGradient(void* stream, int32_t ordinal, ffi::RemainingArgs args,
                       ffi::RemainingRets rets, std::string_view node, int32_t inputs) {
  return ToError(GradientImpl(GpuPlace(stream, ordinal), args, rets, node, inputs));
}

template <typename Binding>
auto CallAttrs(Binding b) {
  return std::move(b)
      .template Attr<std::string_view>("key")
      .template Attr<std::string_view>("reference")
      .template Attr<std::string_view>("pickled")
      .template Attr<std::string_view>("framework")
      .template Attr<std::string_view>("node")
      .template Attr<int32_t>("copy")
      .template Attr<int32_t>("flags");
}

XLA_FFI_DEFINE_HANDLER(kHostCall, HostCall,
                       CallAttrs(ffi::Ffi::Bind().RemainingArgs().RemainingRets()));
XLA_FFI_DEFINE_HANDLER(kGpuCall, GpuCall,
                       CallAttrs(ffi::Ffi::Bind()
                                     .Ctx<ffi::PlatformStream<void*>>()
                                     .Ctx<ffi::DeviceOrdinal>()
                                     .RemainingArgs()
                                     .RemainingRets()));
XLA_FFI_DEFINE_HANDLER(kHostGradient, HostGradient,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("node")
                           .Attr<int32_t>("inputs"));
XLA_FFI_DEFINE_HANDLER(kGpuGradient, GpuGradient,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<void*>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("node")
                           .Attr<int32_t>("inputs"));

// What registering the handlers with XLA's FFI said ("" when all went well).
std::string& RegistrationErrors() {
  static auto* errors = new std::string;
  return *errors;
}

// XLA's FFI table, xla::ffi::GetXlaFfiApi() of libtensorflow_cc.so.2: a C++
// symbol whose header (xla/ffi/ffi_api.h) needs MLIR's, which the wheel does
// not ship, so it is looked up by its mangled name, as eager_tensors.cc
// looks up TF's exports.
const XLA_FFI_Api* FfiApi() {
  using GetApiFn = const XLA_FFI_Api* (*)();
  const char* name = "_ZN3xla3ffi12GetXlaFfiApiEv";
  void* found = dlsym(RTLD_DEFAULT, name);
  if (found == nullptr) {
    // Loaded (a dependency of this library), maybe not in the global scope.
    if (void* lib = dlopen("libtensorflow_cc.so.2", RTLD_LAZY | RTLD_NOLOAD)) {
      found = dlsym(lib, name);
      dlclose(lib);  // drops the reference RTLD_NOLOAD took
    }
  }
  return found != nullptr ? reinterpret_cast<GetApiFn>(found)() : nullptr;
}

void Register(const char* name, const char* platform, XLA_FFI_Handler* handler) {
  static const XLA_FFI_Api* api = FfiApi();
  std::string& errors = RegistrationErrors();
  if (api == nullptr) {
    if (errors.empty()) errors = "xla::ffi::GetXlaFfiApi is not exported by this TensorFlow";
    return;
  }
  XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(
      api, name, platform, XLA_FFI_Handler_Bundle{nullptr, nullptr, nullptr, handler});
  if (error == nullptr) return;
  if (!errors.empty()) errors += "; ";
  errors += std::string(name) + " on " + platform + ": " +
            std::string(ffi::internal::GetErrorMessage(api, error));
  ffi::internal::DestroyError(api, error);
}

// At load time: XLA looks the targets up when it compiles a program.
[[maybe_unused]] const bool kRegistered = [] {
  Register(kXlaCallTarget, "Host", kHostCall);
  Register(kXlaGradientTarget, "Host", kHostGradient);
  Register(kXlaCallTarget, "CUDA", kGpuCall);
  Register(kXlaGradientTarget, "CUDA", kGpuGradient);
  return true;
}();

}  // namespace
}  // namespace pyfunc_bridge

// The FFI registrations that failed ("" for none), for the op layer's checks.
extern "C" __attribute__((visibility("default"))) const char*
PyfuncBridge_XlaRegistrationErrors() {
  return pyfunc_bridge::RegistrationErrors().c_str();
}
