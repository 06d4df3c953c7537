// The PfbTraceApi table (trace.h): TSL's TraceMe recorder, the mechanism TF's
// own kernels record their profiler events with.  TraceMe itself is a scoped
// C++ object; the conversion layer records complete events with explicit
// times instead (the events of a call are known when it ends, and a worker
// process's times arrive with its reply), which is what TraceMe::Stop does.
#include "trace.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "tsl/profiler/lib/traceme.h"
#include "xla/tsl/profiler/backends/cpu/traceme_recorder.h"
#include "xla/tsl/profiler/utils/time_utils.h"

namespace pyfunc_bridge {
namespace {

using ::tsl::profiler::TraceMeRecorder;

// The conversion layer reads TSL's trace level through a plain int pointer
// (PfbTraceApi.level): a std::atomic<int> is an int in memory, lock-free.
static_assert(sizeof(std::atomic<int>) == sizeof(int) &&
                  alignof(std::atomic<int>) == alignof(int) &&
                  std::atomic<int>::is_always_lock_free,
              "PfbTraceApi.level reads TSL's std::atomic<int> trace level as an int");

int64_t Now() { return tsl::profiler::GetCurrentTimeNanos(); }

void Record(const char* name, size_t name_len, int64_t start_ns, int64_t end_ns,
            int32_t level) {
  // TraceMe's own checks: the level and filter of the session (it may have
  // stopped since the call began), and a complete event's positive times.
  if (!TraceMeRecorder::Active(level) ||
      !TraceMeRecorder::CheckFilter(tsl::profiler::kTraceMeDefaultFilterMask) ||
      start_ns <= 0 || end_ns < start_ns) {
    return;
  }
  TraceMeRecorder::Record({std::string(name, name_len), start_ns, end_ns});
}

const PfbTraceApi kTraceApi = {
    PFB_BRIDGE_ABI_VERSION,
    reinterpret_cast<const int*>(&tsl::profiler::internal::g_trace_level),
    Now,
    Record,
};

}  // namespace
}  // namespace pyfunc_bridge

extern "C" __attribute__((visibility("default"))) const PfbTraceApi*
PyfuncBridge_TraceApi() {
  return &pyfunc_bridge::kTraceApi;
}
