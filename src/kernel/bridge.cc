// Shared by the bridge kernels: DLPack -> TF outputs and the call into the
// conversion layer (see bridge.h; the inputs and the dtype table: inputs.cc).
#include "bridge.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "bridge_abi.h"
#include "eager_tensors.h"
#include "pool_route.h"
#include "python_gil.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tsl/profiler/lib/traceme.h"
#include "xla/stream_executor/stream.h"

namespace pyfunc_bridge {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::tstring;

namespace {

bool SameDLDataType(const DLDataType& a, const DLDataType& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// Whether memory on DLPack device `a` can be an output on device `b`.  Host
// memory is one address space: TF numbers its logical CPUs (CPU:1 exports as
// kDLCPU id 1) but any of them can take any host buffer.  Device memory must
// be on the op's own device, whatever its index.
bool SameMemory(const DLDevice& a, const DLDevice& b) {
  return a.device_type == b.device_type &&
         (a.device_type == kDLCPU || a.device_id == b.device_id);
}

}  // namespace

absl::Status ReadCopyMode(tensorflow::OpKernelConstruction* ctx, int32_t* mode) {
  *mode = PFB_COPY_NONE;
  if (!ctx->HasAttr("copy")) return absl::OkStatus();
  std::string copy;
  TF_RETURN_IF_ERROR(ctx->GetAttr("copy", &copy));
  if (copy == "true") *mode = PFB_COPY_TRUE;
  if (copy == "false") *mode = PFB_COPY_FALSE;
  return absl::OkStatus();
}

namespace {

// --------------------------------------------------------------- outputs --

// A TensorBuffer over memory owned by a DLPack producer (an ndarray kept alive
// by the conversion layer).  Releasing it calls the producer's deleter.
class DLPackBuffer : public tensorflow::TensorBuffer {
 public:
  DLPackBuffer(DLManagedTensorVersioned* managed, void* data, size_t size)
      : TensorBuffer(data), managed_(managed), size_(size) {}
  ~DLPackBuffer() override { ReleaseWithGil(managed_); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(
      tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocated_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("pyfunc_bridge");
  }
  // Memory the producer gave away (IS_COPIED: nothing else reaches it) may
  // be written in place by TF's kernels and the next bridge call; any other
  // may be reachable elsewhere.
  bool OwnsMemory() const override {
    return (managed_->flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0;
  }

 private:
  DLManagedTensorVersioned* managed_;
  size_t size_;
};

// A view of (part of) an input tensor's buffer.  An output that is a view of
// an input shares TF's buffer directly instead of keeping the Python view (and
// through it the whole chain of earlier calls) alive.
class AliasBuffer : public tensorflow::TensorBuffer {
 public:
  AliasBuffer(const tensorflow::TensorBuffer* root, void* data, size_t size)
      : TensorBuffer(data), root_(root), size_(size) {
    root_->Ref();  // released in the destructor
  }
  ~AliasBuffer() override { root_->Unref(); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override {
    return const_cast<tensorflow::TensorBuffer*>(root_);
  }
  void FillAllocationDescription(
      tensorflow::AllocationDescription* proto) const override {
    root_->FillAllocationDescription(proto);
  }
  bool OwnsMemory() const override { return false; }

 private:
  const tensorflow::TensorBuffer* root_;
  size_t size_;
};

// The buffer of the input whose memory holds [data, data + nbytes), if any.
const tensorflow::TensorBuffer* InputHolding(OpKernelContext* ctx,
                                            const char* data, size_t nbytes) {
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    const Tensor& in = ctx->input(i);
    // Strings and variants (py_function's forward state) hold no raw memory.
    if (!tensorflow::DataTypeCanUseMemcpy(in.dtype())) continue;
    const auto bytes = in.tensor_data();
    if (bytes.empty()) continue;
    if (data >= bytes.data() && data + nbytes <= bytes.data() + bytes.size()) {
      // The root: aliases of aliases must not form chains.
      return const_cast<tensorflow::TensorBuffer*>(
                 tensorflow::DMAHelper::buffer(&in))->root_buffer();
    }
  }
  return nullptr;
}

// Owns one output's DLPack tensor until it is wrapped; the GIL is held.
struct OutputRef {
  DLManagedTensorVersioned* managed;
  ~OutputRef() {
    if (managed != nullptr && managed->deleter != nullptr) {
      managed->deleter(managed);
    }
  }
  DLManagedTensorVersioned* release() {
    DLManagedTensorVersioned* m = managed;
    managed = nullptr;
    return m;
  }
};

// Output `index` in device memory, copied from `nbytes` of host memory on
// the op's stream; waits for the copy, since the host memory goes after.
absl::Status CopyToDevice(OpKernelContext* ctx, int index, const TensorShape& shape,
                          const char* data, size_t nbytes) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
  stream_executor::Stream* stream =
      ctx->op_device_context() != nullptr ? ctx->op_device_context()->stream() : nullptr;
  if (stream == nullptr) {
    return absl::InternalError("pyfunc_bridge: output " + std::to_string(index) +
                               " must go to the GPU, which has no stream here");
  }
  stream_executor::DeviceAddressBase dst(
      const_cast<char*>(out->tensor_data().data()), nbytes);
  TF_RETURN_IF_ERROR(stream->Memcpy(&dst, data, nbytes));
  return stream->BlockHostUntilDone();
}

absl::Status MakeOutput(OpKernelContext* ctx, int index,
                        const PfbOutputSpec& spec,
                        DLManagedTensorVersioned* managed) {
  OutputRef ref{managed};
  // Built on the error paths only: every call passes here.
  auto where = [index] { return "pyfunc_bridge: output " + std::to_string(index); };
  if (managed == nullptr) {
    return absl::InternalError(where() + ": the conversion layer returned no tensor");
  }
  const DLTensor& t = managed->dl_tensor;
  // A result in host memory for an output in device memory (a NumPy array, an
  // int32 tensor, which TF keeps in host memory on a GPU): copied there below.
  const bool to_device =
      t.device.device_type == kDLCPU && spec.device.device_type == kDLCUDA;
  if (!to_device && !SameMemory(t.device, spec.device)) {
    return absl::InternalError(
        where() + " came back on DLPack device (" +
        std::to_string(t.device.device_type) + ", " +
        std::to_string(t.device.device_id) + "), the op needs it on (" +
        std::to_string(spec.device.device_type) + ", " +
        std::to_string(spec.device.device_id) + ")");
  }
  if (!SameDLDataType(t.dtype, spec.dtype)) {
    return absl::InternalError(where() + " came back with the wrong DLPack dtype");
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return absl::InternalError(where() + " has a malformed shape");
  }
  TensorShape shape;
  TF_RETURN_IF_ERROR(tensorflow::TensorShapeUtils::MakeShape(
      t.shape, t.ndim, &shape));
  const DataType dtype = ctx->expected_output_dtype(index);
  const char* data = static_cast<const char*>(t.data) + t.byte_offset;

  if (dtype == tensorflow::DT_STRING) {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
    auto flat = out->flat<tstring>();
    const auto* records = reinterpret_cast<const PfbStringRef*>(data);
    for (int64_t i = 0; i < flat.size(); ++i) {
      flat(i).assign(records[i].data, records[i].size);
    }
    return absl::OkStatus();
  }

  // A TF tensor the kernel exported (an EagerTensor's, PfbEagerApi): the
  // output is that tensor itself, sharing its buffer as TF's own kernels do.
  if (const Tensor* own = ExportedTensor(managed);
      !to_device && own != nullptr && own->dtype() == dtype) {
    ctx->set_output(index, *own);
    return absl::OkStatus();
  }
  const size_t nbytes = static_cast<size_t>(shape.num_elements()) *
                        tensorflow::DataTypeSize(dtype);
  if (nbytes == 0) {
    Tensor* out = nullptr;
    return ctx->allocate_output(index, shape, &out);
  }
  // The conversion layer makes every copy (bridge_abi.h, PfbCall.outputs), so
  // a tensor that TF cannot wrap as it is would be a bug of that layer: an
  // error here, never a silent second copy.
  if (t.strides != nullptr ||
      reinterpret_cast<uintptr_t>(data) % PFB_TENSOR_ALIGNMENT != 0) {
    return absl::InternalError(
        where() + " came back " +
        (t.strides != nullptr ? "with strides" : "not 64-byte aligned") +
        "; the conversion layer hands over compact, aligned memory only");
  }
  if (to_device) return CopyToDevice(ctx, index, shape, data, nbytes);
  // Zero copy: a view of an input shares that input's TF buffer (the Python
  // view is released now); other memory stays with its producer.
  tensorflow::TensorBuffer* buffer;
  if (const auto* root = InputHolding(ctx, data, nbytes)) {
    buffer = new AliasBuffer(root, const_cast<char*>(data), nbytes);
  } else {
    buffer = new DLPackBuffer(ref.release(), const_cast<char*>(data), nbytes);
  }
  Tensor out(dtype, shape, buffer);  // takes its own reference
  buffer->Unref();
  ctx->set_output(index, out);
  return absl::OkStatus();
}

}  // namespace

BridgeKernel::~BridgeKernel() { DecrefWithGil(site_); }

BridgeKernel::BridgeKernel(OpKernelConstruction* ctx, int num_bridge_outputs, bool async)
    : AsyncOpKernel(ctx), async_(async) {
  if (ctx->HasAttr("key")) OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
  for (auto [name, value] : {std::pair{"reference", &reference_},
                             std::pair{"pickled", &pickled_},
                             std::pair{"framework", &framework_}}) {
    if (ctx->HasAttr(name)) OP_REQUIRES_OK(ctx, ctx->GetAttr(name, value));
  }
  OP_REQUIRES_OK(ctx, ReadCopyMode(ctx, &copy_mode_));
  std::vector<PartialTensorShape> shapes;
  if (ctx->HasAttr("out_shapes")) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("out_shapes", &shapes));
  }
  const int n = num_bridge_outputs < 0 ? ctx->num_outputs() : num_bridge_outputs;
  OP_REQUIRES(ctx, shapes.empty() || static_cast<int>(shapes.size()) == n,
              absl::InvalidArgumentError("out_shapes must be empty or have one "
                                         "entry per output"));
  device_name_ = ctx->device()->name();
  on_gpu_ = ctx->device_type() == tensorflow::DEVICE_GPU;
  if (on_gpu_) device_ = DLDevice{kDLCUDA, ctx->device()->parsed_name().id};
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    if (ctx->input_type(i) == tensorflow::DT_VARIANT) continue;  // not handed over
    DLDataType unused;
    OP_REQUIRES_OK(ctx, ToDLDataType(ctx->input_type(i), &unused));
  }
  dims_.resize(n);
  specs_.resize(n);
  for (int i = 0; i < n; ++i) {
    PfbOutputSpec& spec = specs_[i];
    OP_REQUIRES_OK(ctx, ToDLDataType(ctx->output_type(i), &spec.dtype));
    spec.ndim = -1;
    spec.dims = nullptr;
    const bool host = !on_gpu_ ||
                      ctx->output_memory_types()[i] == tensorflow::HOST_MEMORY;
    spec.device = host ? DLDevice{kDLCPU, 0} : device_;
    if (!shapes.empty() && !shapes[i].unknown_rank()) {
      for (int64_t d : shapes[i].dim_sizes()) dims_[i].push_back(d);
      spec.ndim = shapes[i].dims();
    }
  }
  for (int i = 0; i < n; ++i) specs_[i].dims = dims_[i].data();
}

bool BridgeKernel::MayRoute(int32_t flags, void** state) const {
  // A process-pool call without Python (pool_route.h): numpy_function's
  // kernels on the CPU, on TF's own threads (a call on a Python thread, an
  // eager one, keeps the Python path: its waits see Ctrl-C), while no
  // profiler records (the Python path puts the call's events on the trace).
  return !on_gpu_ && flags == 0 && state == nullptr && GilScope::OnWorkerThread() &&
         !tsl::profiler::TraceMe::Active(PFB_TRACE_FUNCTION);
}

bool BridgeKernel::RunBridge(OpKernelContext* ctx, int first_input,
                             int32_t flags, void** state) {
  const bool may_route = MayRoute(flags, state);
  RouteRef route = may_route ? route_.Get() : RouteRef();  // outlives `native`
  NativeCall native;  // finished after the Python path below, which may read its reply
  if (route) {
    switch (native.Run(ctx, route.get(), first_input, specs_, copy_mode_)) {
      case NativeOutcome::kDone:
        return ctx->status().ok();
      case NativeOutcome::kGone:
        route_.Clear(route.get());
        break;
      case NativeOutcome::kDeclined:
      case NativeOutcome::kReply:  // the conversion layer turns the reply into outputs
      case NativeOutcome::kPosted:  // (not Run's)
        break;
    }
  }
  return RunPython(ctx, first_input, flags, state, may_route, &native);
}

void BridgeKernel::ComputeAsync(OpKernelContext* ctx, DoneCallback done) {
  const bool may_route = MayRoute(0, nullptr);
  RouteRef route = may_route ? route_.Get() : RouteRef();
  if (route) {
    const PfbDispatchRoute* used = route.get();  // (compared only, by Clear)
    switch (PostNative(ctx, std::move(route), 0, specs_, copy_mode_, done, this)) {
      case NativeOutcome::kPosted:
        return;  // `done` is the reply's now; `this` may be gone
      case NativeOutcome::kGone:
        route_.Clear(used);
        break;
      default:
        break;
    }
  }
  RunPython(ctx, 0, 0, nullptr, may_route, nullptr);
  done();
}

void BridgeKernel::Continue(OpKernelContext* ctx, NativeOutcome outcome, NativeCall* call,
                            const PfbDispatchRoute* route) {
  if (outcome == NativeOutcome::kGone) route_.Clear(route);
  RunPython(ctx, 0, 0, nullptr, true, call);
}

bool BridgeKernel::RunPython(OpKernelContext* ctx, int first_input, int32_t flags,
                             void** state, bool may_route, NativeCall* native) {
  PfbDispatchCall* reply = native != nullptr ? native->reply() : nullptr;
  const int num_inputs = ctx->num_inputs() - first_input;
  const int num_outputs = static_cast<int>(specs_.size());
  absl::InlinedVector<DLManagedTensorVersioned*, 8> inputs;
  inputs.reserve(num_inputs);
  auto fail = [&](const absl::Status& s) {
    for (auto* m : inputs) m->deleter(m);  // TF-only deleters: no GIL
    ctx->SetStatus(s);
    return false;
  };
  for (int i = first_input; i < ctx->num_inputs(); ++i) {
    const bool host = !on_gpu_ ||
                      ctx->input_memory_type(i) == tensorflow::HOST_MEMORY;
    DLManagedTensorVersioned* managed = nullptr;
    const Tensor& input = ctx->input(i);
    // TF's own test for writing an input in place (forward_input): nothing
    // but this call holds its buffer, so a write to it is seen nowhere else.
    const bool exclusive = input.dtype() != tensorflow::DT_STRING && input.RefCountIsOne();
    absl::Status s = ExportInput(input, host ? DLDevice{kDLCPU, 0} : device_, &managed,
                                 exclusive);
    if (!s.ok()) return fail(s);
    inputs.push_back(managed);
  }
  void* stream = nullptr;
  if (on_gpu_ && ctx->op_device_context() != nullptr &&
      ctx->op_device_context()->stream() != nullptr) {
    stream_executor::Stream* s = ctx->op_device_context()->stream();
    // Frameworks other than TF do not order their work after TF's stream:
    // the inputs must be complete before the function sees them.
    absl::Status done = s->BlockHostUntilDone();
    if (!done.ok()) return fail(done);
    stream = s->platform_specific_handle().stream;
  }

  GilScope gil;
  if (!gil.ok()) {
    return fail(absl::CancelledError(
        "pyfunc_bridge: the Python interpreter is not running (it is "
        "shutting down); the function for key '" + key_ + "' was not run"));
  }
  const PfbBridgeApi* api = nullptr;
  absl::Status s = GetBridgeApi(&api);
  if (!s.ok()) return fail(s);

  absl::InlinedVector<DLManagedTensorVersioned*, 8> outputs(num_outputs,
                                                            nullptr);
  PfbCall call;
  call.key = key_.data();
  call.key_len = key_.size();
  call.copy_mode = copy_mode_;
  call.flags = flags | (GilScope::OnWorkerThread() ? PFB_CALL_WORKER_THREAD : 0);
  call.num_inputs = num_inputs;
  call.inputs = inputs.data();
  call.num_outputs = num_outputs;
  call.output_specs = specs_.data();
  call.outputs = outputs.data();
  call.device_name = device_name_.c_str();
  call.stream = stream;
  call.state = state != nullptr ? *state : nullptr;
  call.reference = reference_.data();
  call.reference_len = reference_.size();
  call.pickled = pickled_.data();
  call.pickled_len = pickled_.size();
  call.framework = framework_.data();
  call.framework_len = framework_.size();
  call.eager = (flags & PFB_CALL_TENSORS) ? EagerApi() : nullptr;
  call.site = &site_;
  // An eager op's kernel is named after its op type, which no graph node can
  // be (node names hold no '>', our op types do): it ran no node.
  const bool has_node = name() != type_string();
  call.node_name = has_node ? name().data() : nullptr;
  call.node_name_len = has_node ? name().size() : 0;
  void* offered = nullptr;
  call.route = may_route && reply == nullptr && route_.Get() == nullptr ? &offered : nullptr;
  call.reply = reply;
  PfbStatus status{0, nullptr};
  api->call(&call, &status);  // consumes the inputs, on every path
  route_.Set(static_cast<PfbDispatchRoute*>(offered));
  if (reply != nullptr && call.reply == nullptr) native->ReplyTaken();  // else handed back when `native` goes
  // A recorded state is the caller's on error too (bridge_abi.h).
  if (state != nullptr) *state = call.state;
  if (status.code != 0) {
    std::string message = status.message ? status.message : "(no message)";
    std::free(status.message);
    ctx->SetStatus(absl::Status(static_cast<absl::StatusCode>(status.code),
                                message));
    return false;
  }
  std::free(status.message);
  for (int i = 0; i < num_outputs; ++i) {
    s = MakeOutput(ctx, i, specs_[i], outputs[i]);  // consumes it
    if (!s.ok()) {
      for (int j = i + 1; j < num_outputs; ++j) OutputRef{outputs[j]};
      ctx->SetStatus(s);
      return false;
    }
  }
  return true;
}

}  // namespace pyfunc_bridge
