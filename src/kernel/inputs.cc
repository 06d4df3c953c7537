// TF tensors as DLPack inputs (see bridge.h): the kernel's one dtype table,
// ExportInput and ExportedTensor.
#include "bridge.h"

#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "bridge_abi.h"
#include "dtype_table.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace pyfunc_bridge {

using ::tensorflow::DataType;
using ::tensorflow::Tensor;
using ::tensorflow::tstring;

// TF DataType -> DLPack dtype, by the project's dtype table (dtype_table.h).
absl::Status ToDLDataType(DataType dtype, DLDataType* out) {
  const int row = pfb_dtype_by_tf(dtype);
  if (row >= 0) {
    *out = DLDataType{pfb_dtypes[row].code, pfb_dtypes[row].bits, 1};
  } else if (dtype == tensorflow::DT_STRING) {
    *out = DLDataType{PFB_STRING_DTYPE_CODE, PFB_STRING_DTYPE_BITS, 1};
  } else {
    return absl::InvalidArgumentError(
        "pyfunc_bridge does not support tensors of dtype " + tensorflow::DataTypeString(dtype));
  }
  return absl::OkStatus();
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
