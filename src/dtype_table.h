/* The project's one dtype table: each dtype whose values cross the bridge as
 * memory, as TensorFlow, XLA, DLPack and NumPy spell it.  The kernel (C++:
 * bridge.cc, xla_call.cc), the conversion layer and the pool module (Cython,
 * through src/dtype_table.pxd: the pool's records, both sides') include it,
 * and every lookup below is generated from the rows.  Plain C that includes
 * only stdint.h: the pool module, which workers load, is built without
 * TensorFlow's and DLPack's headers (the kernel checks the numbers against
 * both, bridge.cc and xla_call.cc). */
#ifndef PYFUNC_BRIDGE_DTYPE_TABLE_H_
#define PYFUNC_BRIDGE_DTYPE_TABLE_H_

#include <stdint.h>

/* DLPack's DLDataTypeCode (dlpack.h), the code of the pool's records
 * (PfbPoolTensor.code, src/pool/shm_layout.h). */
enum {
  PFB_DL_INT = 0,
  PFB_DL_UINT = 1,
  PFB_DL_FLOAT = 2,
  PFB_DL_OPAQUE_HANDLE = 3,
  PFB_DL_BFLOAT = 4,
  PFB_DL_COMPLEX = 5,
  PFB_DL_BOOL = 6
};

/* X(name, TF enum, TF DT_ suffix, XLA ffi::DataType, DLPack code, bits,
 *   NumPy kind), one lane each; the item size is bits / 8.
 * name: tf.DType's and NumPy's (np.dtype(name), ml_dtypes imported for
 * bfloat16); TF enum: DataType of types.proto.  NumPy kind 'V' is also raw
 * bytes and every other ml_dtypes type: a NumPy lookup compares the name. */
#define PFB_DTYPES(X)                                             \
  X(float32, 1, FLOAT, F32, PFB_DL_FLOAT, 32, 'f')                \
  X(float64, 2, DOUBLE, F64, PFB_DL_FLOAT, 64, 'f')               \
  X(float16, 19, HALF, F16, PFB_DL_FLOAT, 16, 'f')                \
  X(bfloat16, 14, BFLOAT16, BF16, PFB_DL_BFLOAT, 16, 'V')         \
  X(int8, 6, INT8, S8, PFB_DL_INT, 8, 'i')                        \
  X(int16, 5, INT16, S16, PFB_DL_INT, 16, 'i')                    \
  X(int32, 3, INT32, S32, PFB_DL_INT, 32, 'i')                    \
  X(int64, 9, INT64, S64, PFB_DL_INT, 64, 'i')                    \
  X(uint8, 4, UINT8, U8, PFB_DL_UINT, 8, 'u')                     \
  X(uint16, 17, UINT16, U16, PFB_DL_UINT, 16, 'u')                \
  X(uint32, 22, UINT32, U32, PFB_DL_UINT, 32, 'u')                \
  X(uint64, 23, UINT64, U64, PFB_DL_UINT, 64, 'u')                \
  X(bool, 10, BOOL, PRED, PFB_DL_BOOL, 8, 'b')                    \
  X(complex64, 8, COMPLEX64, C64, PFB_DL_COMPLEX, 64, 'c')        \
  X(complex128, 18, COMPLEX128, C128, PFB_DL_COMPLEX, 128, 'c')

/* Strings are TF's DT_STRING only: not memory, so no row.  The bridge hands
 * them over as PfbStringRef arrays (bridge_abi.h), the pool's records as
 * PFB_POOL_TENSOR_STRINGS blocks; XLA has none. */
enum { PFB_TF_DT_STRING = 7 };

/* PFB_TF_DT_FLOAT ...: the TF enum of each row. */
#define PFB_DTYPE_TF_ENUM_(name, tf, dt, xla, code, bits, kind) PFB_TF_DT_##dt = tf,
enum { PFB_DTYPES(PFB_DTYPE_TF_ENUM_) };

/* PFB_DTYPE_FLOAT ...: each row's index in pfb_dtypes. */
#define PFB_DTYPE_INDEX_(name, tf, dt, xla, code, bits, kind) PFB_DTYPE_##dt,
enum { PFB_DTYPES(PFB_DTYPE_INDEX_) PFB_NUM_DTYPES };

typedef struct PfbDtype {
  const char* name;
  int32_t tf_enum;
  uint8_t code;  /* DLPack */
  uint8_t bits;
  char numpy_kind;
} PfbDtype;

#define PFB_DTYPE_ROW_(name, tf, dt, xla, code, bits, kind) {#name, tf, code, bits, kind},
static const PfbDtype pfb_dtypes[PFB_NUM_DTYPES] = {PFB_DTYPES(PFB_DTYPE_ROW_)};

/* Each lookup returns a row's index, or -1 for a dtype outside the table. */
#define PFB_DTYPE_BY_TF_(name, tf, dt, xla, code, bits, kind) \
  case tf: return PFB_DTYPE_##dt;
static inline int pfb_dtype_by_tf(int tf_enum) {
  switch (tf_enum) {
    PFB_DTYPES(PFB_DTYPE_BY_TF_)
    default: return -1;
  }
}

#define PFB_DTYPE_BY_DL_(name, tf, dt, xla, code, bits, kind) \
  case (code) << 8 | (bits): return PFB_DTYPE_##dt;
static inline int pfb_dtype_by_dl(int code, int bits, int lanes) {
  if (lanes != 1 || code < 0 || code > 255 || bits < 0 || bits > 255) return -1;
  switch (code << 8 | bits) {
    PFB_DTYPES(PFB_DTYPE_BY_DL_)
    default: return -1;
  }
}

/* By NumPy's dtype.kind and itemsize (kind 'V': compare the name too). */
#define PFB_DTYPE_BY_NUMPY_(name, tf, dt, xla, code, bits, kind) \
  case (kind) << 8 | (bits) / 8: return PFB_DTYPE_##dt;
static inline int pfb_dtype_by_numpy(char kind, int64_t itemsize) {
  if (itemsize < 0 || itemsize > 255) return -1;
  switch ((unsigned char)kind << 8 | (int)itemsize) {
    PFB_DTYPES(PFB_DTYPE_BY_NUMPY_)
    default: return -1;
  }
}

#endif /* PYFUNC_BRIDGE_DTYPE_TABLE_H_ */
