# The one declaration of bridge_abi.h, the kernel <-> conversion contract.
from libc.stdint cimport int32_t, int64_t

from includes.dlpack cimport DLDataType, DLDevice, DLManagedTensorVersioned

cdef extern from "bridge_abi.h" nogil:
    enum:
        PFB_BRIDGE_ABI_VERSION
        PFB_TENSOR_ALIGNMENT
        PFB_COPY_NONE
        PFB_COPY_TRUE
        PFB_COPY_FALSE
        PFB_STRING_DTYPE_CODE
        PFB_STRING_DTYPE_BITS
        PFB_CALL_WORKER_THREAD
        PFB_CALL_TENSORS
        PFB_CALL_RECORD
        PFB_CALL_GRADIENT
        PFB_TRACE_FUNCTION
        PFB_TRACE_DETAIL
    const char* PFB_BRIDGE_CAPSULE

    ctypedef struct PfbStringRef:
        const char* data
        size_t size

    ctypedef struct PfbOutputSpec:
        DLDataType dtype
        int32_t ndim
        const int64_t* dims
        DLDevice device

    ctypedef struct PfbEagerApi:
        void* (*to_eager)(const DLManagedTensorVersioned*) noexcept
        DLManagedTensorVersioned* (*from_eager)(void*) noexcept

    ctypedef struct PfbCall:
        const char* key
        size_t key_len
        int32_t copy_mode
        int32_t flags
        int32_t num_inputs
        DLManagedTensorVersioned** inputs
        int32_t num_outputs
        const PfbOutputSpec* output_specs
        DLManagedTensorVersioned** outputs
        const char* device_name
        void* stream
        void* state
        const char* reference
        size_t reference_len
        const char* pickled
        size_t pickled_len
        const char* framework
        size_t framework_len
        const PfbEagerApi* eager
        void** site
        const char* node_name
        size_t node_name_len
        void** route
        void* reply

    ctypedef struct PfbStatus:
        int32_t code
        char* message

    ctypedef struct PfbBridgeApi:
        int32_t abi_version
        int32_t (*call)(PfbCall*, PfbStatus*) noexcept

    ctypedef struct PfbTraceApi:
        int32_t abi_version
        const int* level
        int64_t (*now)() noexcept
        void (*record)(const char*, size_t, int64_t, int64_t, int32_t) noexcept

    int pfb_trace_level(const int* level) noexcept
