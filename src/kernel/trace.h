// TF's profiler for the conversion layer (PfbTraceApi, bridge_abi.h): the
// kernel library links TSL's TraceMe recorder (libtensorflow_framework), the
// conversion layer does not, so the kernel publishes what a bridge call needs
// to put its events on TF's trace.
#ifndef PYFUNC_BRIDGE_KERNEL_TRACE_H_
#define PYFUNC_BRIDGE_KERNEL_TRACE_H_

#include "bridge_abi.h"

// For the op layer (ctypes), which hands the table to the conversion layer
// (set_trace_api): static, lives as long as the process.
extern "C" const PfbTraceApi* PyfuncBridge_TraceApi();

#endif  // PYFUNC_BRIDGE_KERNEL_TRACE_H_
