// qkv_front host layer: shape support, the projection check, the per-call
// argument checks that guard the launch, and the workspace sizing.
#include <algorithm>
#include <array>
#include <atomic>
#include <stdexcept>

#include "../common/checks.h"
#include "muse_decode/arch.h"
#include "muse_decode/qkv_front.h"

namespace muse_decode {

using detail::cat;
using detail::expected_text;
using detail::fail;

namespace {

using Reason = std::optional<std::string>;

#define MUSE_RETURN_IF(expr)         \
  do {                               \
    if (auto reason_ = (expr)) return reason_; \
  } while (0)

std::string address_str(const void* p) {
  return cat("address 0x", std::hex, reinterpret_cast<uintptr_t>(p));
}

std::string strides_str(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += cat(i ? ", " : "", t.stride[i]);
  return s + "]";
}

// The order of every tensor's checks: present, dtype, device, shape, strides,
// alignment (FlashMLA's order).
Reason tensor_basics(const TensorRef& t, std::string_view name, DType dtype, int device) {
  if (!t.present() || t.data == nullptr) return cat(name, " is missing (null data)");
  if (t.dtype != dtype) return expected_text(name, dtype_name(dtype), dtype_name(t.dtype));
  if (t.device < 0) return cat(name, " must be on a CUDA device, got host memory");
  if (device >= 0 && t.device != device) return cat(name, " must be on cuda:", device, ", got cuda:", t.device);
  return std::nullopt;
}

Reason aligned16(const TensorRef& t, std::string_view name) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return cat(name, " must be 16-byte aligned, got ", address_str(t.data));
  return std::nullopt;
}

// A 2-D row-major view read or written 16 bytes at a time by row: unit column
// stride, row stride a multiple of 8 elements and at least the row width.
Reason rows16(const TensorRef& t, std::string_view name, int64_t width) {
  if (t.stride[1] != 1 && t.shape[1] > 1)
    return expected_text(name, "unit stride along columns", cat("stride ", t.stride[1]));
  if (t.shape[0] > 1 && (t.stride[0] % 8 != 0 || t.stride[0] < width))
    return expected_text(cat(name, " rows"),
                         cat("16-byte aligned (row stride a multiple of 8 elements, at least ", width, ")"),
                         cat("row stride ", t.stride[0]));
  return aligned16(t, name);
}

Reason contiguous_1d(const TensorRef& t, std::string_view name, int64_t length, const char* what) {
  if (t.ndim != 1 || t.shape[0] != length || (length > 1 && t.stride[0] != 1))
    return expected_text(name, cat("a contiguous [", length, "] (", what, ")"),
                         cat(t.shape_str(), t.ndim == 1 && t.shape[0] == length ? " strided" : ""));
  return std::nullopt;
}

Reason disjoint(const TensorRef& a, const char* an, const TensorRef& b, const char* bn) {
  if (a.present() && b.present() && detail::overlaps(a, b)) return cat(an, " and ", bn, " must not overlap in memory");
  return std::nullopt;
}

// GPU family and multiprocessor count per device, asked once: the per-call
// path must stay within a few microseconds of host time.
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_family{};  // 0: not asked yet, else GpuFamily + 1
std::array<std::atomic<int>, kMaxDevices> g_sms{};     // 0: not asked yet

GpuFamily family_of(int device) {
  if (device < 0 || device >= kMaxDevices) return gpu_family(device);
  int f = g_family[device].load(std::memory_order_relaxed);
  if (f == 0) {
    f = static_cast<int>(gpu_family(device)) + 1;
    g_family[device].store(f, std::memory_order_relaxed);
  }
  return static_cast<GpuFamily>(f - 1);
}

int sms_of(int device) {
  if (device < 0 || device >= kMaxDevices) return sm_count(device);
  int n = g_sms[device].load(std::memory_order_relaxed);
  if (n == 0) {
    n = sm_count(device);
    g_sms[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

bool valid_kv_heads(int kvh) { return kvh == 1 || kvh == 2 || kvh == 4 || kvh == 8 || kvh == 16; }

int num_tiles(int kvh) { return qkv_width(kvh) / kFrontTileRows; }

int64_t counter_bytes(int kvh) { return (static_cast<int64_t>(num_tiles(kvh)) * 4 + 255) / 256 * 256; }

// Everything but the workspace; fills *p when given.
Reason check_call(const TensorRef& x, const TensorRef& weight, const TensorRef& positions,
                  const TensorRef& cos_sin, const TensorRef& slot_mapping, const TensorRef& kv_cache,
                  int num_kv_heads, const TensorRef* out, QkvFrontParams* p) {
  // x decides the device and the number of tokens.
  MUSE_RETURN_IF(tensor_basics(x, "x", DType::kBFloat16, -1));
  const int dev = x.device;
  if (x.ndim != 2 || x.shape[0] < 1 || x.shape[0] > kFrontMaxTokens || x.shape[1] != kHiddenSize)
    return expected_text("x", cat("[T, ", kHiddenSize, "] with 1 <= T <= ", kFrontMaxTokens), x.shape_str());
  MUSE_RETURN_IF(rows16(x, "x", kHiddenSize));
  const int64_t T = x.shape[0];

  if (!valid_kv_heads(num_kv_heads)) return expected_text("num_kv_heads", "one of 1, 2, 4, 8, 16", num_kv_heads);
  const int64_t N = qkv_width(num_kv_heads);

  MUSE_RETURN_IF(tensor_basics(weight, "weight", DType::kBFloat16, dev));
  if (weight.ndim != 2 || weight.shape[0] != N || weight.shape[1] != kHiddenSize)
    return expected_text("weight", cat("[", N, ", ", kHiddenSize, "] for ", num_kv_heads, " KV heads"),
                         weight.shape_str());
  if (!weight.contiguous()) return expected_text("weight", "contiguous", cat("strides ", strides_str(weight)));
  MUSE_RETURN_IF(aligned16(weight, "weight"));

  MUSE_RETURN_IF(tensor_basics(positions, "positions", DType::kInt64, dev));
  MUSE_RETURN_IF(contiguous_1d(positions, "positions", T, "one per token of x"));

  if (cos_sin.present()) {
    MUSE_RETURN_IF(tensor_basics(cos_sin, "cos_sin", DType::kFloat32, dev));
    if (cos_sin.ndim != 2 || cos_sin.shape[0] < 1 || cos_sin.shape[1] != kHeadDim)
      return expected_text("cos_sin", cat("[max_pos, ", kHeadDim, "] with max_pos >= 1 (cos | sin)"),
                           cos_sin.shape_str());
    if (!cos_sin.contiguous()) return expected_text("cos_sin", "contiguous", cat("strides ", strides_str(cos_sin)));
    MUSE_RETURN_IF(aligned16(cos_sin, "cos_sin"));
  }

  MUSE_RETURN_IF(tensor_basics(slot_mapping, "slot_mapping", DType::kInt64, dev));
  MUSE_RETURN_IF(contiguous_1d(slot_mapping, "slot_mapping", T, "one per token of x"));

  MUSE_RETURN_IF(tensor_basics(kv_cache, "kv_cache", DType::kBFloat16, dev));
  if (kv_cache.ndim != 4 || kv_cache.shape[0] < 1 || kv_cache.shape[1] != num_kv_heads ||
      kv_cache.shape[2] != kPageSize || kv_cache.shape[3] != kCacheRowWidth)
    return expected_text("kv_cache",
                         cat("[pages, ", num_kv_heads, ", ", kPageSize, ", ", kCacheRowWidth, "] (num_kv_heads = ",
                             num_kv_heads, ")"),
                         kv_cache.shape_str());
  if (!kv_cache.contiguous()) return expected_text("kv_cache", "contiguous", cat("strides ", strides_str(kv_cache)));
  MUSE_RETURN_IF(aligned16(kv_cache, "kv_cache"));

  if (out) {
    MUSE_RETURN_IF(tensor_basics(*out, "out", DType::kBFloat16, dev));
    if (out->ndim != 2 || out->shape[0] != T || out->shape[1] != N)
      return expected_text("out", cat("[", T, ", ", N, "] (tokens of x, qkv width)"), out->shape_str());
    MUSE_RETURN_IF(rows16(*out, "out", N));
    MUSE_RETURN_IF(disjoint(*out, "out", x, "x"));
    MUSE_RETURN_IF(disjoint(*out, "out", weight, "weight"));
    MUSE_RETURN_IF(disjoint(*out, "out", positions, "positions"));
    MUSE_RETURN_IF(disjoint(*out, "out", cos_sin, "cos_sin"));
    MUSE_RETURN_IF(disjoint(*out, "out", slot_mapping, "slot_mapping"));
    MUSE_RETURN_IF(disjoint(*out, "out", kv_cache, "kv_cache"));
  }
  MUSE_RETURN_IF(disjoint(kv_cache, "kv_cache", x, "x"));
  MUSE_RETURN_IF(disjoint(kv_cache, "kv_cache", weight, "weight"));
  MUSE_RETURN_IF(disjoint(kv_cache, "kv_cache", positions, "positions"));
  MUSE_RETURN_IF(disjoint(kv_cache, "kv_cache", cos_sin, "cos_sin"));
  MUSE_RETURN_IF(disjoint(kv_cache, "kv_cache", slot_mapping, "slot_mapping"));

  if (!supported_family(family_of(dev))) return unavailable("qkv_front");

  if (p) {
    p->x = x.data;
    p->x_stride = T > 1 ? x.stride[0] : kHiddenSize;
    p->weight = weight.data;
    p->positions = static_cast<const int64_t*>(positions.data);
    p->cos_sin = cos_sin.present() ? static_cast<const float*>(cos_sin.data) : nullptr;
    p->max_pos = cos_sin.present() ? cos_sin.shape[0] : 0;
    p->slot_mapping = static_cast<const int64_t*>(slot_mapping.data);
    p->kv_cache = kv_cache.data;
    p->num_slots = kv_cache.shape[0] * kPageSize;
    if (out) {
      p->out = out->data;
      p->out_stride = T > 1 ? out->stride[0] : N;
    }
    p->num_tokens = static_cast<int>(T);
    p->num_kv_heads = num_kv_heads;
  }
  return std::nullopt;
}

}  // namespace

bool supports_shape(int n, int num_kv_heads) {
  return valid_kv_heads(num_kv_heads) && n == qkv_width(num_kv_heads);
}

int qkv_front_ctas(int num_kv_heads, int sm_count) {
  if (!valid_kv_heads(num_kv_heads)) fail(expected_text("num_kv_heads", "one of 1, 2, 4, 8, 16", num_kv_heads));
  if (sm_count < 1) fail(expected_text("sm_count", "at least 1", sm_count));
  // A persistent grid: one CTA per SM streams 1/sm_count of the weight (TP8 on
  // an H200: 4608 blocks of 8 KB over 132 CTAs = 34.9 each, so the busiest CTA
  // reads 0.3% more than the mean). More CTAs than SMs would only add a tail.
  return static_cast<int>(std::min<int64_t>(sm_count, int64_t{num_tiles(num_kv_heads)} * kFrontBlocksPerTile));
}

int64_t qkv_front_workspace_bytes(int num_kv_heads, int sm_count) {
  const int ctas = qkv_front_ctas(num_kv_heads, sm_count);
  // CTA c writes the partial of tile t into slot t + c: the tiles of CTA c+1
  // start at or after the last tile of CTA c, so slots never collide and the
  // largest is (tiles - 1) + (ctas - 1).
  return counter_bytes(num_kv_heads) + int64_t{num_tiles(num_kv_heads) + ctas - 1} * kFrontPartialBytes;
}

int64_t qkv_front_workspace_bytes_for_device(int num_kv_heads, int device) {
  const int sms = sms_of(device);
  if (sms < 1) fail(cat("qkv_front_workspace_bytes: no CUDA device ", device, " (", describe_device(device), ")"));
  return qkv_front_workspace_bytes(num_kv_heads, sms);
}

QkvViews split_qkv(const TensorRef& qkv, int num_kv_heads) {
  if (!valid_kv_heads(num_kv_heads)) fail(expected_text("num_kv_heads", "one of 1, 2, 4, 8, 16", num_kv_heads));
  const int64_t q_width = int64_t{kHeadsPerKvHead} * num_kv_heads * kHeadDim;
  const int64_t kv_width = int64_t{num_kv_heads} * kHeadDim;
  const int64_t n = 2 * q_width + 2 * kv_width;
  if (!qkv.present() || qkv.ndim != 2 || qkv.shape[1] != n)
    fail(expected_text("qkv", cat("[tokens, ", n, "] for ", num_kv_heads, " KV heads"), qkv.shape_str()));
  QkvViews v;
  v.q = qkv;
  v.q.shape[1] = q_width;
  v.gate = qkv;
  v.gate.shape[1] = q_width;
  v.gate.data = static_cast<char*>(qkv.data) + (q_width + 2 * kv_width) * qkv.stride[1] * dtype_size(qkv.dtype);
  return v;
}

std::optional<std::string> unsupported_projection(const ProjectionDesc& a) {
  if (a.quantized) return std::string("a quantized QKV projection (the front reads an unquantized bf16 weight)");
  if (a.has_bias) return std::string("a QKV projection with a bias (the front adds none)");
  if (a.gather_output && a.tp_size > 1)
    return cat("a QKV projection that gathers its output over TP ", a.tp_size,
               " (the front writes this rank's columns)");
  if (a.head_dim != kHeadDim) return cat("head_dim ", a.head_dim, " (the front is built for ", kHeadDim, ")");
  if (!valid_kv_heads(a.num_kv_heads))
    return cat(a.num_kv_heads, " KV heads per rank (the front serves 1, 2, 4, 8 or 16)");
  if (a.num_heads != kHeadsPerKvHead * a.num_kv_heads)
    return cat(a.num_heads, " query heads for ", a.num_kv_heads, " KV heads (the front needs ", kHeadsPerKvHead,
               " per KV head)");
  const int64_t n = 2 * int64_t{a.num_heads + a.num_kv_heads} * a.head_dim;
  const TensorRef& w = a.weight;
  if (!w.present() || w.data == nullptr) return std::string("no QKV weight");
  if (w.dtype != DType::kBFloat16) return cat("a ", dtype_name(w.dtype), " QKV weight (the front reads bfloat16)");
  if (w.ndim != 2 || w.shape[0] != n || w.shape[1] != kHiddenSize)
    return cat("a QKV weight of shape ", w.shape_str(), " (the front reads [", n, ", ", kHiddenSize, "])");
  if (!w.contiguous()) return std::string("a non-contiguous QKV weight");
  if (reinterpret_cast<uintptr_t>(w.data) % 16) return std::string("a QKV weight not 16-byte aligned (the front reads it with TMA)");
  if (w.device < 0) return std::string("a QKV weight in host memory");

  const RotaryDesc& r = a.rotary;
  if (!a.use_rope) {
    if (r.present) return std::string("a rotary table on a layer without RoPE");
    return std::nullopt;
  }
  if (!r.present) return std::string("a RoPE layer without a rotary table");
  if (r.rotary_dim != a.head_dim) return cat("rotary_dim ", r.rotary_dim, " (the front rotates all ", kHeadDim, " dims)");
  if (r.is_neox_style) return std::string("a neox-style rotary table (the front rotates interleaved pairs)");
  const TensorRef& t = r.cos_sin;
  if (!t.present() || t.data == nullptr) return std::string("a rotary embedding without a cos_sin table");
  if (t.dtype != DType::kFloat32) return cat("a ", dtype_name(t.dtype), " rotary table (the front reads float32)");
  if (t.ndim != 2 || t.shape[1] != kHeadDim || t.shape[0] < 1)
    return cat("a rotary table of shape ", t.shape_str(), " (the front reads [max_pos, ", kHeadDim, "])");
  if (!t.contiguous()) return std::string("a non-contiguous rotary table");
  return std::nullopt;
}

std::optional<std::string> unsupported_call(const TensorRef& x, const TensorRef& weight, const TensorRef& positions,
                                            const TensorRef& cos_sin, const TensorRef& slot_mapping,
                                            const TensorRef& kv_cache, int num_kv_heads, const TensorRef& out) {
  return check_call(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads,
                    out.present() ? &out : nullptr, nullptr);
}

bool supports_call(const TensorRef& x, const TensorRef& weight, const TensorRef& positions, const TensorRef& cos_sin,
                   const TensorRef& slot_mapping, const TensorRef& kv_cache, int num_kv_heads) {
  return !check_call(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, nullptr, nullptr);
}

bool supports_call(const TensorRef& x, const TensorRef& weight, const TensorRef& positions, const TensorRef& cos_sin,
                   const TensorRef& slot_mapping, const TensorRef& kv_cache, int num_kv_heads, const TensorRef& out) {
  return !check_call(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, &out, nullptr);
}

QkvFrontParams check_qkv_front(const TensorRef& x, const TensorRef& weight, const TensorRef& positions,
                               const TensorRef& cos_sin, const TensorRef& slot_mapping, const TensorRef& kv_cache,
                               int num_kv_heads, const TensorRef& out, const TensorRef& workspace) {
  QkvFrontParams p;
  if (auto why = check_call(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, &out, &p))
    fail(*why);
  // The workspace last: its size depends on the device the call runs on.
  const int dev = x.device;
  if (auto why = tensor_basics(workspace, "workspace", workspace.dtype, dev)) fail(*why);
  const int sms = sms_of(dev);
  const int64_t need = qkv_front_workspace_bytes(num_kv_heads, std::max(sms, 1));
  const int64_t have = workspace.contiguous() ? workspace.numel() * dtype_size(workspace.dtype) : 0;
  if (workspace.ndim != 1 || have < need)
    fail(expected_text("workspace",
                       cat("a contiguous 1-D buffer of at least ", need, " bytes (qkv_front_workspace_bytes for ",
                           num_kv_heads, " KV heads, ", sms, " SMs)"),
                       cat(workspace.shape_str(), " of ", dtype_name(workspace.dtype), ", ", have, " bytes")));
  if (auto why = aligned16(workspace, "workspace")) fail(*why);
  const TensorRef* others[] = {&x, &weight, &positions, &cos_sin, &slot_mapping, &kv_cache, &out};
  const char* names[] = {"x", "weight", "positions", "cos_sin", "slot_mapping", "kv_cache", "out"};
  for (int i = 0; i < 7; ++i)
    if (auto why = disjoint(workspace, "workspace", *others[i], names[i])) fail(*why);
  p.workspace = workspace.data;
  p.num_ctas = qkv_front_ctas(num_kv_heads, std::max(sms, 1));
  return p;
}

void qkv_front(const TensorRef& x, const TensorRef& weight, const TensorRef& positions, const TensorRef& cos_sin,
               const TensorRef& slot_mapping, const TensorRef& kv_cache, int num_kv_heads, const TensorRef& out,
               const TensorRef& workspace, Stream stream, bool pdl) {
  QkvFrontParams p =
      check_qkv_front(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace);
  p.pdl = pdl;
  if (int err = launch_qkv_front(p, stream))
    throw std::runtime_error(cat("qkv_front: kernel launch failed (CUDA error ", err, ")"));
}

#undef MUSE_RETURN_IF

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the launch with
// cudaErrorNotSupported.
namespace muse_decode {
int prepare_qkv_front() { return 801; }
int launch_qkv_front(const QkvFrontParams&, Stream) { return 801; }
}  // namespace muse_decode
#endif
