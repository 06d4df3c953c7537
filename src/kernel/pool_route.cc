// A bridge kernel's process-pool calls without Python (see pool_route.h).
#include "pool_route.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "bridge.h"
#include "pool/futex.h"
#include "pool/input_records.h"
#include "pool/reply_decode.h"
#include "pool/route_counts.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace pyfunc_bridge {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::tstring;

// The call's inputs as the dispatcher takes them (it copies them into the
// input arena before submit returns), described by the records' one rule
// (input_records.h), with their counts for the statistics.
struct NativeInputs {
  absl::InlinedVector<PfbDispatchInput, 8> items;
  std::vector<std::vector<int64_t>> dims;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> strings;  // the strings blocks
  PfbInputCounts counts{};
};

namespace {

// A submit that finds no room in the input arena waits this long for the
// native calls in flight to free some (with none in flight it does not wait:
// dispatch.h, ENOSPC), then leaves the call to the Python path (which knows
// which of its calls hold blocks).
constexpr int64_t kRoomWaitNs = 1000000000;

// A kernel's result goes to TF over its block: the pool's alignment must do.
static_assert(PFB_POOL_ALIGN % PFB_TENSOR_ALIGNMENT == 0, "result blocks' alignment");

// A worker's result block as a TF buffer: the tensor shares the worker's
// memory (no copy), and when TF drops the last tensor over it, the block goes
// back to its worker.  Holds a reference on the arena's mapping, which so
// outlives the worker, the pool and Python's mapping.
class ArenaBuffer : public tensorflow::TensorBuffer {
 public:
  ArenaBuffer(const PfbDispatchApi* api, PfbDispatchArena* arena, uint64_t offset,
              size_t size)
      : TensorBuffer(arena->base + offset), api_(api), arena_(arena), offset_(offset),
        size_(size) {
    api_->arena_keep(arena_);  // dropped in the destructor
  }
  ~ArenaBuffer() override {
    api_->arena_hand_back(arena_, offset_);
    api_->arena_drop(arena_);
  }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocated_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("pyfunc_bridge_pool");
  }
  // The worker's memory: never written in place by a TF op.
  bool OwnsMemory() const override { return false; }

 private:
  const PfbDispatchApi* api_;
  PfbDispatchArena* arena_;  // a reference of this buffer's
  uint64_t offset_;
  size_t size_;
};

bool MakeInputs(OpKernelContext* ctx, int first_input, uint32_t call_flags, NativeInputs* in) {
  const int n = ctx->num_inputs() - first_input;
  in->dims.resize(n);
  in->items.resize(n);
  for (int i = 0; i < n; ++i) {
    const Tensor& t = ctx->input(first_input + i);
    if (t.dims() > PFB_POOL_MAX_NDIM) return false;
    for (int64_t d : t.shape().dim_sizes()) in->dims[i].push_back(d);
    if (t.dtype() == tensorflow::DT_STRING) {
      auto flat = t.flat<tstring>();
      std::vector<PfbBytes> elements(flat.size());
      for (int64_t j = 0; j < flat.size(); ++j) elements[j] = {flat(j).data(), flat(j).size()};
      char* block = pfb_input_strings(&in->items[i], elements.data(), elements.size(), t.dims(),
                                      in->dims[i].data(), &in->counts);
      if (block == nullptr) return false;
      in->strings.emplace_back(block, &std::free);
    } else {
      DLDataType dtype;
      if (!ToDLDataType(t.dtype(), &dtype).ok()) return false;
      pfb_input_numbers(&in->items[i], t.tensor_data().data(), t.tensor_data().size(),
                        dtype.code, dtype.bits, dtype.lanes, t.dims(), in->dims[i].data(),
                        call_flags, &in->counts);
    }
  }
  return true;
}

// Whether the decoded result `r` is an array of numbers that the output
// `spec` takes as it is (dtype, declared dimensions), and that the copy
// policy accepts: anything else goes to the conversion layer, whose checks
// convert it or raise.  Under copy=False a record with a copy fact set
// (shm_layout.h, PFB_POOL_TENSOR_REFUSED_MASK) goes there too, so that its
// refusal is the one error text of _copy_reason.
bool Fits(const PfbReplyResult& r, const PfbOutputSpec& spec, tensorflow::DataType dtype,
          int32_t copy_mode, TensorShape* shape) {
  const PfbPoolTensor& record = r.record;
  if (record.flags & (PFB_POOL_TENSOR_STRINGS | PFB_POOL_TENSOR_PICKLED)) return false;
  if (copy_mode == PFB_COPY_FALSE && (record.flags & PFB_POOL_TENSOR_REFUSED_MASK)) {
    return false;
  }
  if (record.code != spec.dtype.code || record.bits != spec.dtype.bits ||
      record.lanes != spec.dtype.lanes || dtype == tensorflow::DT_STRING) {
    return false;
  }
  if (spec.ndim >= 0) {
    if (record.ndim != spec.ndim) return false;
    for (int i = 0; i < spec.ndim; ++i) {
      if (spec.dims[i] >= 0 && spec.dims[i] != r.dims[i]) return false;
    }
  }
  return tensorflow::TensorShapeUtils::MakeShape(r.dims, record.ndim, shape).ok();
}

}  // namespace

// ------------------------------------------------------------- RouteSlot --

RouteRef RouteSlot::Get() {
  std::lock_guard<std::mutex> lock(mu_);
  if (route_ != nullptr) route_->api->route_keep(route_.get());
  return RouteRef(route_.get());
}

void RouteSlot::Set(PfbDispatchRoute* route) {
  RouteRef offered(route);  // unless taken (a concurrent call's came first), dropped after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (route_ == nullptr) route_ = std::move(offered);
}

void RouteSlot::Clear(const PfbDispatchRoute* route) {
  RouteRef dropped;  // dropped after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (route_.get() == route) dropped = std::move(route_);
}

// ------------------------------------------------------------ NativeCall --

NativeCall::NativeCall() = default;

NativeCall::~NativeCall() {
  if (route_ == nullptr) return;
  if (replied_) route_->api->reply_hand_back(&call_);  // an untaken reply's result blocks
  route_->api->finish(route_->d, &call_);
}

bool NativeCall::Describe(OpKernelContext* ctx, const PfbDispatchRoute* route, int first_input) {
  began_ = pfb_clock_ns(CLOCK_MONOTONIC);
  in_ = std::make_unique<NativeInputs>();
  if (!MakeInputs(ctx, first_input, route->flags, in_.get())) return false;
  route_ = route;
  return true;
}

NativeOutcome NativeCall::Submitted(int rc) {
  if (rc == 0) return NativeOutcome::kPosted;
  // EPIPE: the pool closed (or this is a fork of its process); ENOENT: the
  // function was dropped.  Others (no worker ready yet, no room, an input
  // that never fits) are for the Python path this time only.
  return rc == EPIPE || rc == ENOENT ? NativeOutcome::kGone : NativeOutcome::kDeclined;
}

NativeOutcome NativeCall::Run(OpKernelContext* ctx, const PfbDispatchRoute* route,
                              int first_input, const std::vector<PfbOutputSpec>& specs,
                              int32_t copy_mode) {
  if (!Describe(ctx, route, first_input)) return NativeOutcome::kDeclined;
  posted_ = pfb_clock_ns(CLOCK_REALTIME);
  // (A lost worker or a closed pool ends the wait: never for ever.)
  const NativeOutcome submitted = Submitted(route_->api->call(
      route_->d, route_->token, route_->flags, in_->items.data(),
      static_cast<uint32_t>(in_->items.size()), kRoomWaitNs, -1, &call_));
  return submitted == NativeOutcome::kPosted ? Complete(ctx, specs, copy_mode) : submitted;
}

NativeOutcome NativeCall::Post(void (*on_end)(PfbDispatchCall*, void*), void* arg) {
  posted_ = pfb_clock_ns(CLOCK_REALTIME);
  return Submitted(route_->api->post(route_->d, route_->token, route_->flags, in_->items.data(),
                                     static_cast<uint32_t>(in_->items.size()), kRoomWaitNs,
                                     &call_, on_end, arg));
}

NativeOutcome NativeCall::Ended(OpKernelContext* ctx, const std::vector<PfbOutputSpec>& specs,
                                int32_t copy_mode, void (*on_end)(PfbDispatchCall*, void*),
                                void* arg) {
  if (__atomic_load_n(&call_.state, __ATOMIC_SEQ_CST) == PFB_DISPATCH_RESEND) {
    // Its worker died before it started the call: the function never ran,
    // so it goes again (as pfb_dispatch_call does for a waiting caller).
    route_->api->finish(route_->d, &call_);
    return Post(on_end, arg);
  }
  return Complete(ctx, specs, copy_mode);
}

void NativeCall::Wait(int64_t wait_ns) { route_->api->wait(&call_, wait_ns); }

bool NativeCall::Abandon() {
  return route_ != nullptr && route_->api->abandon(route_->d, &call_) != 0;
}

NativeOutcome NativeCall::Complete(OpKernelContext* ctx, const std::vector<PfbOutputSpec>& specs,
                                   int32_t copy_mode) {
  const PfbDispatchApi* api = route_->api;
  const bool counting = pfb_route_counting(route_->counting);
  PfbDispatchRouteCounts* counts = const_cast<PfbDispatchRouteCounts*>(&route_->counts);
  if (call_.state == PFB_DISPATCH_FAILED) {
    if (counting) {
      // The function's error; not a call its worker answered (the pool's
      // calls and bytes_in), as on the Python path.
      pfb_route_count_failed(counts);
      pfb_route_add(&counts->errors, 1);
      pfb_route_add(&counts->strings_in, in_->counts.string_bytes);
      pfb_route_add(&counts->worker_in, in_->counts.to_worker);
      pfb_route_add(&counts->total_ns, pfb_clock_ns(CLOCK_MONOTONIC) - began_);
    }
    ctx->SetStatus(absl::Status(static_cast<absl::StatusCode>(call_.error_code),
                                call_.error != nullptr ? call_.error : "pyfunc_bridge: the "
                                                                     "pool call failed"));
    return NativeOutcome::kDone;
  }
  replied_ = true;  // from here on, the result blocks are this call's
  const PfbPoolMessage& m = call_.reply[0].message;
  // A call its worker answered: the pool's figures, and the inputs' share
  // of the function's (route_counts.h, as the Python path counts).
  auto count_answered = [&] {
    pfb_route_count_answered(counts, &m, posted_, in_->counts.bytes, in_->counts.string_bytes,
                             in_->counts.to_worker);
  };
  // A call handed to Python (which counts the rest).
  auto replied = [&] {
    if (counting) {
      count_answered();
      pfb_route_add(&counts->replied, 1);
    }
    return NativeOutcome::kReply;
  };
  const size_t n = specs.size();
  const bool arity = m.flags == PFB_POOL_DONE_ONE ? (n == 1 && m.count == 1)
                                                   : (n >= 2 && m.count == n);
  if (m.status != PFB_POOL_STATUS_OK || !arity) return replied();
  // The one decoder of a DONE (the Python path's too) checks each block;
  // one it refuses goes to the conversion layer, which raises its error.
  absl::InlinedVector<PfbReplyResult, 2> decoded(n);
  uint32_t count = 0;
  if (pfb_reply_decode(call_.reply, call_.arena != nullptr ? call_.arena->bytes : 0,
                       decoded.data(), static_cast<uint32_t>(n), &count) != 0) {
    return replied();
  }
  absl::InlinedVector<TensorShape, 4> shapes(n);
  for (size_t i = 0; i < n; ++i) {
    if (!Fits(decoded[i], specs[i], ctx->expected_output_dtype(i), copy_mode, &shapes[i])) {
      return replied();
    }
  }
  // Every output fits.  The outputs results are copied into come first: if
  // one cannot be made, every block is still this call's (handed back when
  // it goes).
  absl::InlinedVector<Tensor*, 4> copies(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (decoded[i].nbytes != 0 && copy_mode != PFB_COPY_TRUE) continue;
    absl::Status s = ctx->allocate_output(static_cast<int>(i), shapes[i], &copies[i]);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return NativeOutcome::kDone;
    }
  }
  // From here on, each block is handed back by its tensor, or here at once.
  replied_ = false;
  uint64_t bytes_out = 0, shared = 0, copied = 0, saved = 0, worker_copied = 0;
  for (size_t i = 0; i < n; ++i) {
    const PfbReplyResult& r = decoded[i];
    bytes_out += r.nbytes;
    worker_copied += r.worker_copied;  // (the decoder's rule, as the Python path's)
    if (copies[i] != nullptr) {
      if (r.nbytes != 0) {
        std::memcpy(const_cast<char*>(copies[i]->tensor_data().data()),
                    call_.arena->base + r.record.offset, r.nbytes);
      }
      copied += r.nbytes;
      if (r.record.size) api->arena_hand_back(call_.arena, r.record.offset);
      continue;
    }
    auto* buffer = new ArenaBuffer(api, call_.arena, r.record.offset, r.nbytes);
    Tensor out(ctx->expected_output_dtype(i), shapes[i], buffer);  // takes its own reference
    buffer->Unref();
    ctx->set_output(static_cast<int>(i), out);
    shared += r.nbytes;
    if (r.saves_copy) ++saved;
  }
  if (counting) {
    count_answered();
    pfb_route_add(&counts->bytes_out, bytes_out);
    pfb_route_add(&counts->shared_out, shared);
    pfb_route_add(&counts->copied_out, copied);
    pfb_route_add(&counts->copies_saved, saved);
    pfb_route_add(&counts->worker_copied, worker_copied);
    pfb_route_add(&counts->total_ns, pfb_clock_ns(CLOCK_MONOTONIC) - began_);
  }
  return NativeOutcome::kDone;
}

}  // namespace pyfunc_bridge
