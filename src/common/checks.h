// Internal helpers of the host layers: the checks (every failure names the
// argument, what was expected and what was seen, and throws
// std::invalid_argument), their returning form, and the per-device setup
// every prepare_<op> shares.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ios>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "muse_decode/arch.h"
#include "muse_decode/tensor.h"
#include "per_device.h"

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
// (a call runs some 30 of them, and an op has 5 us of host time in all).
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

// The order of every tensor's checks: present, dtype, device, then the
// caller's shape, strides and alignment (FlashMLA's order). device < 0: the
// tensor decides it.
inline void require_tensor(const TensorRef& t, std::string_view name, DType dtype, int device) {
  require_present(t, name);
  require_dtype(t, name, dtype);
  require_cuda(t, name);
  if (device >= 0) require_same_device(t, name, device);
}

inline std::string strides_str(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += cat(i ? ", " : "", t.stride[i]);
  return s + "]";
}

inline void require_contiguous(const TensorRef& t, std::string_view name) {
  if (!t.contiguous()) fail_expected(name, "contiguous", cat("strides ", strides_str(t)));
}

// A 2-D row-major view read (TMA) or written 16 bytes at a time by row: unit
// column stride, row stride a multiple of 8 elements and at least the row
// width, 16-byte aligned.
inline void require_rows16(const TensorRef& t, std::string_view name, int64_t width) {
  if (t.stride[1] != 1 && t.shape[1] > 1) fail_expected(name, "unit stride along columns", cat("stride ", t.stride[1]));
  if (t.shape[0] > 1 && (t.stride[0] % 8 != 0 || t.stride[0] < width))
    fail_expected(cat(name, " rows"), cat("16-byte aligned (row stride a multiple of 8 elements, at least ", width, ")"),
                  cat("row stride ", t.stride[0]));
  require_aligned(t.data, name, 16);
}

// A 1-D tensor of `length` elements, contiguous; `what` says what the length
// counts ("one per token of x").
inline void require_contiguous_1d(const TensorRef& t, std::string_view name, int64_t length, const char* what) {
  if (t.ndim != 1 || t.shape[0] != length || (length > 1 && t.stride[0] != 1))
    fail_expected(name, cat("a contiguous [", length, "] (", what, ")"),
                  cat(t.shape_str(), t.ndim == 1 && t.shape[0] == length ? " strided" : ""));
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

// KV heads per rank that the kernels serve: 16 / TP of Muse Spark's 16, at
// TP1, 2, 4, 8 and 16. qkv_front's stream-K decomposition and attn2's split
// heuristic are built and tested for these counts only.
inline constexpr const char* kKvHeadsText = "one of 1, 2, 4, 8, 16";
constexpr bool supported_kv_heads(int64_t kvh) { return kvh == 1 || kvh == 2 || kvh == 4 || kvh == 8 || kvh == 16; }

inline void require_kv_heads(int kvh, std::string_view name = "num_kv_heads") {
  if (!supported_kv_heads(kvh)) fail_expected(name, kKvHeadsText, kvh);
}

// The returning form of a check: the std::invalid_argument text `check`
// throws, or nullopt. Every unsupported_<op>_call is its check_<op> through
// this, so the two never disagree.
template <typename Check>
std::optional<std::string> reason_of(Check&& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// A CUDA error (as int) from the kernels' entries as std::runtime_error
// "<what> failed (CUDA error N)"; nothing on success.
inline void throw_if_cuda_error(int err, std::string_view what) {
  if (err != 0) throw std::runtime_error(cat(what, " failed (CUDA error ", err, ")"));
}

// ---------------------------------------------------------------------------
// Devices (defined in arch.cc, which sees the CUDA runtime).

// `device`, or the current CUDA device for -1 (0 without CUDA). Throws
// std::invalid_argument for device < -1.
int resolve_device(int device);

// Makes `device` current for its lifetime, then the previous device again.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// The GPUs the kernels are built for, as the refusals name them.
inline constexpr const char* kSupportedGpus = "SM90 (H100/H200) or the SM100 family (B200/B300)";

// What prepare_<op> shares: resolves `device` (std::invalid_argument below
// -1), refuses a GPU the kernels were not built for (std::invalid_argument
// naming the op and what the device is), then makes the op's state of that
// device once, with the device current (std::invalid_argument for a device
// ordinal outside the table). Returns the state; a later call finds it and
// asks the GPU nothing.
template <typename T, typename Make>
const T& prepare_device(PerDevice<T>& state, std::string_view op, int device, Make&& make) {
  device = resolve_device(device);
  if (const T* s = state.find(device)) return *s;
  if (!supported_family(gpu_family(device)))
    fail(cat(op, " runs only on ", kSupportedGpus, "; found: ", describe_device(device)));
  return state.get_or_make(device, [&](int d) {
    DeviceScope scope(d);
    return make(d);
  });
}

// The state prepare_<op>(device) made, or std::invalid_argument saying that
// the call needs it first. One acquire load on the per-call path.
template <typename T>
const T& require_prepared(const PerDevice<T>& state, std::string_view op, int device) {
  if (const T* s = state.find(device)) return *s;
  fail(cat(op, " on cuda:", device, " needs prepare_", op, "(", device, ") first"));
}

}  // namespace muse_decode::detail
