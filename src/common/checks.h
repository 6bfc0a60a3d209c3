// Internal helpers for the host checks: every failure names the argument,
// what was expected and what was seen, and throws std::invalid_argument.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ios>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "muse_decode/tensor.h"

namespace muse_decode::detail {

// Message text without iostreams: an extension module that carries its own
// static libstdc++ next to PyTorch's shared one crashes in ostream's locale
// facets (seen on the H200 image), so the host layer formats by hand.
class Text {
 public:
  void put(const char* s) { out_ += s; }
  void put(const std::string& s) { out_ += s; }
  void put(std::string_view s) { out_.append(s.data(), s.size()); }
  void put(char c) { out_ += c; }
  void put(bool b) { out_ += b ? "true" : "false"; }
  void put(double v) { format("%g", v); }
  void put(float v) { format("%g", static_cast<double>(v)); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  void put(T v) {
    if (hex_) format("%llx", static_cast<unsigned long long>(v));
    else if (std::is_signed_v<T>) format("%lld", static_cast<long long>(v));
    else format("%llu", static_cast<unsigned long long>(v));
  }
  // std::hex switches the integers that follow to hexadecimal; std::dec back.
  void put(std::ios_base& (*manip)(std::ios_base&)) { hex_ = manip == &std::hex; }
  std::string take() { return std::move(out_); }

 private:
  template <typename V>
  void format(const char* fmt, V v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, fmt, v);
    out_ += buf;
  }
  std::string out_;
  bool hex_ = false;
};

template <typename... Args>
std::string cat(const Args&... args) {
  Text t;
  (t.put(args), ...);
  return t.take();
}

[[noreturn]] inline void fail(const std::string& message) { throw std::invalid_argument(message); }

// Argument names travel as string views: a check that passes builds no string
// (a call runs some 30 of them; SPEC section 7 gives an op 5 us of host time).
//
// "<name> must be <expected>, got <actual>": the text (for checks that return
// a reason), and the throw.
template <typename E, typename A>
std::string expected_text(std::string_view name, const E& expected, const A& actual) {
  return cat(name, " must be ", expected, ", got ", actual);
}
template <typename E, typename A>
[[noreturn]] void fail_expected(std::string_view name, const E& expected, const A& actual) {
  fail(expected_text(name, expected, actual));
}

// Present, with data unless it is empty (an empty tensor may have a null
// pointer; the shape checks then say what is wrong with it).
inline void require_present(const TensorRef& t, std::string_view name) {
  if (!t.present() || (t.data == nullptr && t.numel() != 0)) fail(cat(name, " is missing (null data)"));
}

inline void require_dtype(const TensorRef& t, std::string_view name, DType dtype) {
  if (t.dtype != dtype) fail_expected(name, dtype_name(dtype), dtype_name(t.dtype));
}

inline void require_cuda(const TensorRef& t, std::string_view name) {
  if (t.device < 0) fail(cat(name, " must be on a CUDA device, got host memory"));
}

inline void require_same_device(const TensorRef& t, std::string_view name, int device) {
  if (t.device != device) fail(cat(name, " must be on cuda:", device, ", got cuda:", t.device));
}

inline void require_aligned(const void* p, std::string_view name, int bytes) {
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

inline void require_disjoint(const TensorRef& a, std::string_view an, const TensorRef& b, std::string_view bn) {
  if (overlaps(a, b)) fail(cat(an, " and ", bn, " must not overlap in memory"));
}

}  // namespace muse_decode::detail
