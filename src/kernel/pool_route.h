// A bridge kernel's process-pool calls without Python or the GIL, over the
// route (PfbDispatchRoute, src/pool/dispatch.h) the conversion layer handed
// it after its first call; its steps: docs/pool.md ("A kernel's native
// call").  What the kernel cannot turn into outputs goes back to the
// conversion layer with the worker's reply (PfbCall.reply); what the route
// cannot take at all takes the Python path from the start.
#ifndef PYFUNC_BRIDGE_KERNEL_POOL_ROUTE_H_
#define PYFUNC_BRIDGE_KERNEL_POOL_ROUTE_H_

#include <memory>
#include <mutex>
#include <vector>

#include "bridge_abi.h"
#include "pool/dispatch.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace pyfunc_bridge {

// One reference on a route (dropped when it goes), or none.
struct RouteDrop {
  void operator()(PfbDispatchRoute* route) const { route->api->route_drop(route); }
};
using RouteRef = std::unique_ptr<PfbDispatchRoute, RouteDrop>;

// A kernel's route slot, shared by its concurrent Compute() calls.
class RouteSlot {
 public:
  // The route, a reference of the caller's; empty when there is none.
  RouteRef Get();
  // Takes `route` (a new reference, from PfbCall.route), unless the slot
  // holds one already (a concurrent call's): then drops it.
  void Set(PfbDispatchRoute* route);
  // The route stopped serving (its pool closed, its function dropped): the
  // next call takes the Python path, which may offer another.
  void Clear(const PfbDispatchRoute* route);

 private:
  std::mutex mu_;
  RouteRef route_;  // guarded by mu_
};

enum class NativeOutcome {
  kDeclined,  // nothing was sent: take the Python path
  kGone,      // as kDeclined, and the route serves no more (RouteSlot::Clear)
  kDone,      // the outputs are set, or ctx's status says why not
  kReply,     // the call ran: hand call->reply() to the conversion layer
  kPosted,    // posted without waiting: its on_end comes (NativeCall::Post)
};

struct NativeInputs;  // the call's inputs as the dispatcher takes them (pool_route.cc)

// A native call from submit to finish (the destructor finishes it: the
// reply's memory and the arena reference go).
class NativeCall {
 public:
  NativeCall();
  NativeCall(const NativeCall&) = delete;
  ~NativeCall();
  // Describes inputs [first_input, num_inputs) of `ctx` for `route` (the
  // caller's, which outlives this call): false when the records cannot
  // (the Python path takes the call).
  bool Describe(tensorflow::OpKernelContext* ctx, const PfbDispatchRoute* route,
                int first_input);
  // Runs the call of `ctx` (inputs [first_input, num_inputs), outputs as
  // `specs` declare) over `route`, waiting for it: kDeclined, kGone, or as
  // Complete.  `copy_mode`: the op's (copy=True copies the results out of
  // the worker's arena; copy=False hands a result with a copy fact to
  // Python, kReply, whose copy decision refuses it).
  NativeOutcome Run(tensorflow::OpKernelContext* ctx, const PfbDispatchRoute* route,
                    int first_input, const std::vector<PfbOutputSpec>& specs, int32_t copy_mode);
  // Submits it without waiting: kPosted (then on_end(call, arg) comes once,
  // see PfbDispatchCall.on_end), kDeclined or kGone.
  NativeOutcome Post(void (*on_end)(PfbDispatchCall*, void*), void* arg);
  // After on_end: a call its worker died before starting (RESEND) is
  // posted again (Post's outcomes); any other ends as Complete says.
  NativeOutcome Ended(tensorflow::OpKernelContext* ctx, const std::vector<PfbOutputSpec>& specs,
                      int32_t copy_mode, void (*on_end)(PfbDispatchCall*, void*), void* arg);
  // Waits up to `wait_ns` for the posted call to end (pfb_dispatch_wait).
  void Wait(int64_t wait_ns);
  // Takes a posted call back before it completed: true, and no on_end comes.
  bool Abandon();
  // The DONE for PfbCall.reply (nullptr unless the outcome was kReply).
  PfbDispatchCall* reply() { return replied_ ? &call_ : nullptr; }
  // The conversion layer took the reply's result blocks (it set
  // PfbCall.reply to NULL); otherwise the destructor hands them back.
  void ReplyTaken() { replied_ = false; }

 private:
  // The completed call (DONE or FAILED) as outputs, ctx's status, or kReply.
  NativeOutcome Complete(tensorflow::OpKernelContext* ctx, const std::vector<PfbOutputSpec>& specs,
                         int32_t copy_mode);
  NativeOutcome Submitted(int rc);

  const PfbDispatchRoute* route_ = nullptr;  // borrowed: the caller's RouteRef
  std::unique_ptr<NativeInputs> in_;
  int64_t began_ = 0;   // CLOCK_MONOTONIC, at Describe
  int64_t posted_ = 0;  // CLOCK_REALTIME, at the last submit
  PfbDispatchCall call_{};
  bool replied_ = false;
};

// What a posted call's kernel does with an outcome only it can handle
// (kReply, kDeclined, kGone: the Python path), on a completion thread,
// before the op's `done`.
class NativeContinuation {
 public:
  virtual void Continue(tensorflow::OpKernelContext* ctx, NativeOutcome outcome,
                        NativeCall* call, const PfbDispatchRoute* route) = 0;

 protected:
  ~NativeContinuation() = default;
};

// Posts the call of `ctx` over `route` without holding the TF thread
// (docs/pool.md, "A kernel's native call"): kPosted, and `done` is called
// once the reply (or the worker's end, the pool's close, the op's
// cancellation) completed the op, on a completion thread of the kernel
// library, after `then` saw what only the kernel handles.  Otherwise
// (kDeclined, kGone) nothing was sent and `done` was not called.  `specs`
// and `then` outlive the call (the kernel's).
NativeOutcome PostNative(tensorflow::OpKernelContext* ctx, RouteRef route, int first_input,
                         const std::vector<PfbOutputSpec>& specs, int32_t copy_mode,
                         tensorflow::AsyncOpKernel::DoneCallback done, NativeContinuation* then);

}  // namespace pyfunc_bridge

#endif  // PYFUNC_BRIDGE_KERNEL_POOL_ROUTE_H_
