// A torch-free view of a tensor argument: what the host checks need to see.
#pragma once

#include <cstdint>
#include <string>

// CUDA's stream type, declared without the CUDA headers (cudaStream_t is
// CUstream_st*), so the public API compiles on machines without CUDA.
struct CUstream_st;

namespace muse_decode {

using Stream = ::CUstream_st*;

enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kUInt8 = 5,  // workspaces are byte buffers
  kOther = 99,
};

const char* dtype_name(DType dtype);
int dtype_size(DType dtype);  // bytes per element; 0 for kOther

// Up to 4 dimensions; strides in elements. `device` is the CUDA ordinal, or -1
// for host memory. A default-constructed view means "absent" (optional args).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kOther;
  int ndim = -1;  // -1: absent
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
  int device = -1;

  bool present() const { return ndim >= 0; }
  int64_t numel() const;
  bool contiguous() const;
  // Bytes from data to one past the last element (0 when empty).
  int64_t span_bytes() const;
  std::string shape_str() const;  // "[9, 256]"
};

// A contiguous view built from a pointer and a shape (C++ callers, tests).
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, int device = 0);

}  // namespace muse_decode
