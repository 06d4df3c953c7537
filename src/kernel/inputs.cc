// TF tensors as DLPack inputs (see bridge.h): the kernel's one dtype table,
// ExportInput and ExportedTensor.
#include "bridge.h"

#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "bridge_abi.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace pyfunc_bridge {

using ::tensorflow::DataType;
using ::tensorflow::Tensor;
using ::tensorflow::tstring;

// TF DataType -> DLPack dtype: the kernel's one dtype table.
absl::Status ToDLDataType(DataType dtype, DLDataType* out) {
  auto set = [out](uint8_t code, uint8_t bits) {
    *out = DLDataType{code, bits, 1};
    return absl::OkStatus();
  };
  switch (dtype) {
    case tensorflow::DT_HALF: return set(kDLFloat, 16);
    case tensorflow::DT_FLOAT: return set(kDLFloat, 32);
    case tensorflow::DT_DOUBLE: return set(kDLFloat, 64);
    case tensorflow::DT_BFLOAT16: return set(kDLBfloat, 16);
    case tensorflow::DT_INT8: return set(kDLInt, 8);
    case tensorflow::DT_INT16: return set(kDLInt, 16);
    case tensorflow::DT_INT32: return set(kDLInt, 32);
    case tensorflow::DT_INT64: return set(kDLInt, 64);
    case tensorflow::DT_UINT8: return set(kDLUInt, 8);
    case tensorflow::DT_UINT16: return set(kDLUInt, 16);
    case tensorflow::DT_UINT32: return set(kDLUInt, 32);
    case tensorflow::DT_UINT64: return set(kDLUInt, 64);
    case tensorflow::DT_BOOL: return set(kDLBool, 8);
    case tensorflow::DT_COMPLEX64: return set(kDLComplex, 64);
    case tensorflow::DT_COMPLEX128: return set(kDLComplex, 128);
    case tensorflow::DT_STRING:
      return set(PFB_STRING_DTYPE_CODE, PFB_STRING_DTYPE_BITS);
    default:
      return absl::InvalidArgumentError(
          "pyfunc_bridge does not support tensors of dtype " +
          tensorflow::DataTypeString(dtype));
  }
}

namespace {

// ---------------------------------------------------------------- inputs --

// One allocation per input: the DLPack struct, the shape, and a Tensor that
// holds a reference on TF's buffer until the consumer calls the deleter.
struct InputExport {
  DLManagedTensorVersioned managed;
  Tensor tensor;
  absl::InlinedVector<int64_t, 4> shape;
  std::vector<PfbStringRef> strings;  // string tensors only
};

void DeleteInputExport(DLManagedTensorVersioned* managed) {
  delete static_cast<InputExport*>(managed->manager_ctx);
}

}  // namespace

const Tensor* ExportedTensor(const DLManagedTensorVersioned* managed) {
  // Our deleter says the context is ours: any other producer's is opaque.
  if (managed == nullptr || managed->deleter != DeleteInputExport) return nullptr;
  return &static_cast<const InputExport*>(managed->manager_ctx)->tensor;
}

absl::Status ExportInput(const Tensor& tensor, DLDevice device,
                         DLManagedTensorVersioned** out, bool exclusive) {
  auto* e = new InputExport;
  e->tensor = tensor;  // takes a reference on the buffer
  DLManagedTensorVersioned& m = e->managed;
  m.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m.manager_ctx = e;
  m.deleter = DeleteInputExport;
  // TF tensors are immutable to all but their sole holder.
  m.flags = exclusive ? DLPACK_FLAG_BITMASK_IS_COPIED : DLPACK_FLAG_BITMASK_READ_ONLY;
  DLTensor& t = m.dl_tensor;
  absl::Status s = ToDLDataType(tensor.dtype(), &t.dtype);
  if (!s.ok()) {
    delete e;
    return s;
  }
  for (int64_t d : tensor.shape().dim_sizes()) e->shape.push_back(d);
  t.ndim = static_cast<int32_t>(e->shape.size());
  t.shape = e->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  t.device = device;
  if (tensor.dtype() == tensorflow::DT_STRING) {
    auto flat = tensor.flat<tstring>();
    e->strings.resize(flat.size());
    for (int64_t i = 0; i < flat.size(); ++i) {
      e->strings[i] = PfbStringRef{flat(i).data(), flat(i).size()};
    }
    t.data = e->strings.data();
  } else {
    t.data = const_cast<char*>(tensor.tensor_data().data());
  }
  *out = &m;
  return absl::OkStatus();
}

}  // namespace pyfunc_bridge
