#include "muse_decode/tensor.h"

#include <string>

namespace muse_decode {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kOther: break;
  }
  return "an unsupported dtype";
}

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kBFloat16: case DType::kFloat16: return 2;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kOther: break;
  }
  return 0;
}

int64_t TensorRef::numel() const {
  if (ndim < 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorRef::contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

int64_t TensorRef::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < ndim; ++i) last += (shape[i] - 1) * (stride[i] < 0 ? 0 : stride[i]);
  return (last + 1) * dtype_size(dtype);
}

std::string TensorRef::shape_str() const {
  if (ndim < 0) return "absent";
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, int device) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  t.device = device;
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

}  // namespace muse_decode
