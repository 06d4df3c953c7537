/* The contract between the kernel (C++, knows TF + DLPack) and the conversion
 * layer (Cython, knows DLPack + NumPy).  Both sides include this header and
 * nothing else of each other.  Plain C so that Cython can declare it. */
#ifndef PYFUNC_BRIDGE_BRIDGE_ABI_H_
#define PYFUNC_BRIDGE_BRIDGE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "dlpack/dlpack.h"

/* dlpack.h declares only the struct tag in C. */
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;

#define PFB_BRIDGE_ABI_VERSION 6
/* PyCapsule_Import name of the PfbBridgeApi table exported by the conversion layer. */
#define PFB_BRIDGE_CAPSULE "pyfunc_bridge._conversion._bridge_api"

/* DLPack has no string dtype: string tensors cross the bridge as arrays of
 * these records, with dtype {kDLOpaqueHandle, 8 * sizeof(PfbStringRef), 1}. */
typedef struct PfbStringRef {
  const char* data;
  size_t size;
} PfbStringRef;

#define PFB_STRING_DTYPE_CODE kDLOpaqueHandle
#define PFB_STRING_DTYPE_BITS (8 * sizeof(PfbStringRef))

/* TensorFlow needs this alignment to use a foreign buffer without copying
 * it; the conversion layer allocates and hands over memory aligned so. */
#define PFB_TENSOR_ALIGNMENT 64

/* Copy policy, NumPy 2's tri-state (attribute `copy` of the ops). */
enum { PFB_COPY_NONE = 0, PFB_COPY_TRUE = 1, PFB_COPY_FALSE = 2 };

/* What the op declares for one output. */
typedef struct PfbOutputSpec {
  DLDataType dtype;
  int32_t ndim;         /* -1: rank unknown */
  const int64_t* dims;  /* ndim entries, -1 for an unknown dimension */
  DLDevice device;      /* where the kernel needs it: kDLCPU or the op's GPU */
} PfbOutputSpec;

/* PfbCall.flags */
enum {
  /* The kernel runs on a thread that only TF's kernels use (the kernel made
   * its Python thread state): per-thread Python settings may stay installed. */
  PFB_CALL_WORKER_THREAD = 1,
  /* The py_function kernel made the call: its function takes and returns
   * EagerTensors (the conversion layer's EagerTensor converter). */
  PFB_CALL_TENSORS = 2,
  /* py_function ops whose gradient may run: record the function's TF
   * computation and return it in PfbCall.state. */
  PFB_CALL_RECORD = 4,
  /* The gradient op of py_function: PfbCall.state is the recorded forward
   * call, the inputs are the output gradients, the outputs the input ones. */
  PFB_CALL_GRADIENT = 8
};

/* EagerTensors straight from, and back to, the kernel's TF tensors, through
 * the functions TF's own py_function kernel uses (no DLPack, no copy).  The
 * kernel fills the table once, when it finds those TF exports; it lives as
 * long as the process.  Both functions need the GIL held. */
typedef struct PfbEagerApi {
  /* A new reference to an EagerTensor over the TF tensor of `input`: one of
   * the PfbCall.inputs the kernel made, in host memory, not a string
   * (borrowed: the caller still owns and frees it; the EagerTensor holds its
   * own reference on the TF buffer).  NULL on failure, with a Python
   * exception set when Python raised one. */
  void* (*to_eager)(const DLManagedTensorVersioned* input);
  /* `tensor`, a PyObject* (borrowed): when it is an EagerTensor over a TF
   * tensor in host memory, of a dtype the bridge hands over and not a
   * string, a new DLPack tensor (owned by the caller, READ_ONLY, compact
   * row-major) that holds a reference on that tensor's TF buffer; its deleter
   * needs no GIL.  NULL otherwise (no exception): take the DLPack path. */
  DLManagedTensorVersioned* (*from_eager)(void* tensor);
} PfbEagerApi;

typedef struct PfbCall {
  const char* key;
  size_t key_len;
  int32_t copy_mode;
  int32_t flags;
  int32_t num_inputs;
  /* Ownership of every input passes to the callee, on success and on error.
   * Each is flagged DLPACK_FLAG_BITMASK_READ_ONLY (memory others may read:
   * a TF buffer another tensor shares) or DLPACK_FLAG_BITMASK_IS_COPIED (the
   * call's alone: a TF buffer nothing else references, or a copy; the
   * function may write it, and no one else will see the write). */
  DLManagedTensorVersioned* const* inputs;
  int32_t num_outputs;
  const PfbOutputSpec* output_specs;
  /* Filled by the callee on success; the caller then owns each of them and
   * must call its deleter with the GIL held or takeable.  Each has the
   * declared dtype and device and is either empty (no element) or compact
   * row-major with strides == NULL and data aligned to PFB_TENSOR_ALIGNMENT:
   * the callee makes every copy, the caller wraps without one.  Flagged
   * DLPACK_FLAG_BITMASK_IS_COPIED when nothing but the tensor reaches its
   * memory: the caller may then write it in place. */
  DLManagedTensorVersioned** outputs;
  /* The op's TF device, e.g. "/job:localhost/replica:0/task:0/device:CPU:0". */
  const char* device_name;
  /* The op's GPU stream (a cudaStream_t) or NULL on the CPU.  Work the caller
   * enqueued before the call is complete when the call starts. */
  void* stream;
  /* A PyObject*: with PFB_CALL_RECORD the callee may set it to a new
   * reference (the forward state, released by the caller with the GIL held,
   * whether the call succeeded or not);
   * with PFB_CALL_GRADIENT it is that state, borrowed. */
  void* state;
  /* The function's portable description, the op's attributes of the same
   * names; the callee reads them only when no function is registered under
   * `key` (a graph from another process, or one whose source graph is gone).
   * Each is empty when the op has none: `reference` is "module:qualname",
   * `pickled` the function serialized by cloudpickle (binary), `framework`
   * array_function's framework (empty for NumPy). */
  const char* reference;
  size_t reference_len;
  const char* pickled;
  size_t pickled_len;
  const char* framework;
  size_t framework_len;
  /* The kernel's EagerTensor table (owned by the kernel, lives as long as the
   * process) for PFB_CALL_TENSORS calls where TF exports what it needs; NULL
   * otherwise: EagerTensors then go through DLPack. */
  const PfbEagerApi* eager;
  /* A slot of the calling kernel where the callee caches what `key` resolved
   * to (a PyObject*, a new reference, or NULL), so that later calls skip the
   * lookup.  Read and written by the callee only, with the GIL held; the
   * caller releases the object (GIL held or takeable) when the kernel goes.
   * NULL: no slot (an eager call). */
  void** site;
  /* The op's node name (its profiler events say which node ran the call);
   * NULL for a call that ran no graph node (an eager op, call_eagerly). */
  const char* node_name;
  size_t node_name_len;
  /* Process-pool calls without Python (src/pool/dispatch.h, which the
   * kernel includes; the conversion layer sees only addresses).
   * `route`: a PfbDispatchRoute** where a kernel that can dispatch natively
   * (a CPU kernel on a thread of TF's) takes a route, NULL otherwise: after
   * a call that ran in a pool, the callee may set it to a new reference
   * (the kernel's from then on; the kernel then runs the function's calls
   * over it, in C, and this entry point only for what they cannot do).
   * `reply`: a PfbDispatchCall* (DONE) of a call the kernel ran natively
   * and hands over, NULL otherwise: the callee turns its worker's reply
   * into the outputs (or the error) instead of running the function, and
   * sets `reply` to NULL once it has taken the reply's result blocks (the
   * kernel hands back those of a reply still set after the call). */
  void** route;
  void* reply;
} PfbCall;

typedef struct PfbStatus {
  int32_t code;   /* a TensorFlow error code; 0 is OK */
  char* message;  /* malloc'd by the callee, free()d by the caller; may be NULL */
} PfbStatus;

typedef struct PfbBridgeApi {
  int32_t abi_version;
  /* Runs the registered function.  The GIL must be held.  Returns status->code. */
  int32_t (*call)(PfbCall* call, PfbStatus* status);
} PfbBridgeApi;

/* TF's profiler, for the conversion layer, which records each call's events
 * (the function, its inputs, the function itself, its outputs; a worker
 * process's queue and compute) on the thread that ran it, the direct eager
 * path included.  The kernel library links TSL's TraceMe recorder and
 * publishes this table (PFB_TRACE_SYMBOL, static, lives as long as the
 * process); the op layer hands it to the conversion layer when it loads that
 * (set_trace_api).  Until then the conversion layer records nothing. */
#define PFB_TRACE_SYMBOL "PyfuncBridge_TraceApi"

/* TraceMe levels: the function's event is a user annotation (recorded by any
 * profiler session); the events nested in it are details of it. */
enum { PFB_TRACE_FUNCTION = 1, PFB_TRACE_DETAIL = 2 };

typedef struct PfbTraceApi {
  int32_t abi_version; /* PFB_BRIDGE_ABI_VERSION */
  /* TSL's trace level (a std::atomic<int> of TF's): a profiler session
   * records the events of level <= *level; < 1 while none runs.  Read it with
   * pfb_trace_level: one relaxed atomic load, TraceMe's own check, and all a
   * call costs while no profiler runs. */
  const int* level;
  /* TraceMe's clock: ns since the Unix epoch (CLOCK_REALTIME, as
   * time.time_ns() reads it in any process of this machine). */
  int64_t (*now)(void);
  /* Records a complete event of `level` on the calling thread, if a session
   * records that level.  `name` (copied): TraceMe's encoding,
   * "name#key=value,...#" (values without ',' or '#'); the trace viewer nests
   * events of one thread by their times.  Needs no GIL. */
  void (*record)(const char* name, size_t name_len, int64_t start_ns,
                 int64_t end_ns, int32_t level);
} PfbTraceApi;

static inline int pfb_trace_level(const int* level) {
  return __atomic_load_n(level, __ATOMIC_RELAXED);
}

#endif /* PYFUNC_BRIDGE_BRIDGE_ABI_H_ */
