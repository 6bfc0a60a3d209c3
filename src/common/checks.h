// Internal helpers for the host checks: every failure names the argument,
// what was expected and what was seen, and throws std::invalid_argument.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "muse_decode/tensor.h"

namespace muse_decode::detail {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] inline void fail(const std::string& message) { throw std::invalid_argument(message); }

// "<name> must be <expected>, got <actual>"
template <typename E, typename A>
[[noreturn]] void fail_expected(const std::string& name, const E& expected, const A& actual) {
  fail(cat(name, " must be ", expected, ", got ", actual));
}

inline void require_present(const TensorRef& t, const std::string& name) {
  if (!t.present() || t.data == nullptr) fail(cat(name, " is missing (null data)"));
}

inline void require_dtype(const TensorRef& t, const std::string& name, DType dtype) {
  if (t.dtype != dtype) fail_expected(name, dtype_name(dtype), dtype_name(t.dtype));
}

inline void require_cuda(const TensorRef& t, const std::string& name) {
  if (t.device < 0) fail(cat(name, " must be on a CUDA device, got host memory"));
}

inline void require_same_device(const TensorRef& t, const std::string& name, int device) {
  if (t.device != device) fail(cat(name, " must be on cuda:", device, ", got cuda:", t.device));
}

inline void require_aligned(const void* p, const std::string& name, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail(cat(name, " must be ", bytes, "-byte aligned, got address 0x", std::hex,
             reinterpret_cast<uintptr_t>(p)));
}

// Byte ranges [data, data + span) of two tensors overlap.
inline bool overlaps(const TensorRef& a, const TensorRef& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  const auto a1 = a0 + a.span_bytes(), b1 = b0 + b.span_bytes();
  return a0 < b1 && b0 < a1;
}

inline void require_disjoint(const TensorRef& a, const std::string& an, const TensorRef& b,
                             const std::string& bn) {
  if (overlaps(a, b)) fail(cat(an, " and ", bn, " must not overlap in memory"));
}

}  // namespace muse_decode::detail
