// A kernel's posted pool calls (pool_route.h, PostNative): the call from
// ComputeAsync to `done`, and the threads that complete it.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "pool_route.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/platform/threadpool.h"

namespace pyfunc_bridge {

using ::tensorflow::OpKernelContext;

namespace {

// A posted call's poster waits this long for a short call to end on its own
// thread before it returns the thread to TF (AsyncCall::Post).
constexpr int64_t kPostedWaitNs = 2000000;

// The threads that complete posted calls: never the dispatcher's (its reply
// thread holds its worker's reader role, and a `done` may take the GIL or
// run into the dispatcher), nor the op's runner (its threads may all wait
// for `done`: docs/pool.md, Considerations).  Made on
// first use and never destroyed (a static's destructor would race exit).
tsl::thread::ThreadPool* Completions() {
  static tsl::thread::ThreadPool* pool = [] {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    // Without spinning (low_latency_hint false): an idle thread sleeps at
    // once rather than take a core from the workers.
    return new tsl::thread::ThreadPool(tsl::Env::Default(), tsl::ThreadOptions(),
                                       "pyfunc_bridge_replies",
                                       std::min(8, std::max(2, cores)),
                                       /*low_latency_hint=*/false);
  }();
  return pool;
}

// A posted call, from ComputeAsync to `done`: the reply's on_end hands it to
// a completion thread (Complete); a cancellation takes it back (Cancel).
// Deletes itself, then calls `done`.
class AsyncCall {
 public:
  AsyncCall(OpKernelContext* ctx, RouteRef route, const std::vector<PfbOutputSpec>& specs,
            int32_t copy_mode, tensorflow::AsyncOpKernel::DoneCallback done,
            NativeContinuation* then)
      : ctx_(ctx), route_(std::move(route)), specs_(specs), copy_mode_(copy_mode),
        done_(std::move(done)), then_(then) {}

  // On whatever thread ended the call (PfbDispatchCall.on_end): no work
  // here.  A poster still waiting for it completes it itself.
  static void OnEnd(PfbDispatchCall*, void* arg) {
    auto* call = static_cast<AsyncCall*>(arg);
    int waiting = kWaiting;
    if (call->waiting_.compare_exchange_strong(waiting, kEndedWhileWaiting)) return;
    Completions()->Schedule([call] { call->Complete(); });
  }

  NativeOutcome Post(int first_input) {
    if (!native_.Describe(ctx_, route_.get(), first_input)) return NativeOutcome::kDeclined;
    waiting_.store(kWaiting);
    NativeOutcome outcome;
    {
      std::lock_guard<std::mutex> lock(mu_);  // against a RESEND's Complete
      outcome = native_.Post(&AsyncCall::OnEnd, this);
    }
    if (outcome != NativeOutcome::kPosted) return outcome;
    // A short call ends on this thread, as a blocking one would, without
    // the two hand-offs to a completion thread and back to TF's; a longer
    // one frees the thread after kPostedWaitNs (docs/pool.md).
    native_.Wait(kPostedWaitNs);
    // Held from before the exchange until registered: a Complete or Cancel
    // started meanwhile waits for it, so `this` stays until then.
    std::unique_lock<std::mutex> lock(mu_);
    int waiting = kWaiting;
    if (!waiting_.compare_exchange_strong(waiting, kReturned)) {
      const NativeOutcome ended = End();  // ended meanwhile: on_end left it here
      if (ended != NativeOutcome::kPosted) {
        lock.unlock();
        Finish(ended);
        return outcome;  // (`this` is gone)
      }
      // Resent: registered below like the first post, its on_end completes it.
    }
    tensorflow::CancellationManager* cm = ctx_->cancellation_manager();
    if (cm != nullptr) {
      token_ = cm->get_cancellation_token();
      if (cm->RegisterCallback(token_, [this] { Cancel(); })) {
        cm_ = cm;
      } else if (native_.Abandon()) {  // cancelled already
        lock.unlock();
        Cancelled();
      }
    }
    return outcome;  // (`this` may be gone once the lock is)
  }

 private:
  // The call ended (DONE, FAILED, RESEND): on a completion thread.
  void Complete() {
    NativeOutcome outcome;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outcome = End();
      if (outcome == NativeOutcome::kPosted) return;  // resent: its on_end comes
    }
    Finish(outcome);
  }

  // The ended call's outputs or error, or its post again after a RESEND
  // (kPosted); mu_ is held.
  NativeOutcome End() {
    return native_.Ended(ctx_, specs_, copy_mode_, &AsyncCall::OnEnd, this);
  }

  void Finish(NativeOutcome outcome) {
    if (cm_ != nullptr) cm_->DeregisterCallback(token_);  // waits for a Cancel under way
    if (outcome != NativeOutcome::kDone) then_->Continue(ctx_, outcome, &native_, route_.get());
    Release();
  }

  // The op's cancellation (the CancellationManager's callback).
  void Cancel() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!native_.Abandon()) return;  // ended already: Complete finishes it
    lock.unlock();
    Cancelled();
  }

  // Abandoned: no on_end comes.  `done` never runs inside a cancellation
  // callback (TF code after it may deregister from the cancelling manager).
  void Cancelled() {
    Completions()->Schedule([this] {
      ctx_->SetStatus(absl::CancelledError("pyfunc_bridge: the pool call was cancelled"));
      Release();
    });
  }

  // The call's memory, its reply and the route go before `done`, after
  // which the kernel and ctx may go.
  void Release() {
    auto done = std::move(done_);
    delete this;
    done();
  }

  OpKernelContext* ctx_;
  RouteRef route_;  // outlives native_ (declared first)
  NativeCall native_;
  const std::vector<PfbOutputSpec>& specs_;
  const int32_t copy_mode_;
  tensorflow::AsyncOpKernel::DoneCallback done_;
  NativeContinuation* then_;
  // Whether the poster waits for the call (kWaiting), has stopped waiting
  // (kReturned), or saw it end while it waited (kEndedWhileWaiting).
  enum { kReturned = 0, kWaiting = 1, kEndedWhileWaiting = 2 };
  std::atomic<int> waiting_{kReturned};
  std::mutex mu_;  // the call's submit, end and cancellation, one at a time
  tensorflow::CancellationManager* cm_ = nullptr;  // registered with
  tensorflow::CancellationToken token_ = 0;
};

}  // namespace

NativeOutcome PostNative(OpKernelContext* ctx, RouteRef route, int first_input,
                         const std::vector<PfbOutputSpec>& specs, int32_t copy_mode,
                         tensorflow::AsyncOpKernel::DoneCallback done, NativeContinuation* then) {
  auto* call = new AsyncCall(ctx, std::move(route), specs, copy_mode, std::move(done), then);
  const NativeOutcome outcome = call->Post(first_input);
  if (outcome != NativeOutcome::kPosted) delete call;  // nothing sent: `done` not called
  return outcome;
}

}  // namespace pyfunc_bridge
