// qkv_front host layer: shape support, the projection check, the per-call
// argument checks that guard the launch, the workspace sizing, the device
// setup, the launch and the bound form.
#include <algorithm>
#include <stdexcept>

#include "../common/checks.h"
#include "../common/hardware.h"
#include "muse_decode/arch.h"
#include "muse_decode/qkv_front.h"
#include "params.h"

namespace muse_decode {

using detail::cat;
using detail::expected_text;
using detail::fail;
using detail::fail_expected;
using detail::require_contiguous;
using detail::require_contiguous_1d;
using detail::require_kv_heads;
using detail::require_rows16;
using detail::require_tensor;
using qkv_front_impl::kFrontBlocksPerTile;
using qkv_front_impl::kFrontPartialBytes;
using qkv_front_impl::kFrontTileRows;

namespace {

// Prepared devices: their multiprocessor count sizes the grid and the workspace.
struct QkvFrontDevice {
  int sms = 0;
};
detail::PerDevice<QkvFrontDevice> g_prepared;

// The multiprocessor count of a prepared device, else asked of the runtime
// (0 without one).
int sms_of(int device) {
  if (const QkvFrontDevice* d = g_prepared.find(device)) return d->sms;
  return sm_count(device);
}

int num_tiles(int kvh) { return qkv_width(kvh) / kFrontTileRows; }

int64_t counter_bytes(int kvh) { return (static_cast<int64_t>(num_tiles(kvh)) * 4 + 255) / 256 * 256; }

}  // namespace

// The layer's tensors (what QkvFront binds), on `device`; attention_block
// checks its own with them (params.h).
void qkv_front_impl::check_weight(const TensorRef& weight, std::string_view name, int kvh, int device) {
  const int64_t n = qkv_width(kvh);
  require_tensor(weight, name, DType::kBFloat16, device);
  if (weight.ndim != 2 || weight.shape[0] != n || weight.shape[1] != kHiddenSize)
    fail_expected(name, cat("[", n, ", ", kHiddenSize, "] for ", kvh, " KV heads"), weight.shape_str());
  require_contiguous(weight, name);
  detail::require_aligned(weight.data, name, 16);
}

void qkv_front_impl::check_cos_sin(const TensorRef& cos_sin, int device) {
  if (!cos_sin.present()) return;  // a layer without RoPE
  require_tensor(cos_sin, "cos_sin", DType::kFloat32, device);
  if (cos_sin.ndim != 2 || cos_sin.shape[0] < 1 || cos_sin.shape[1] != kHeadDim)
    fail_expected("cos_sin", cat("[max_pos, ", kHeadDim, "] with max_pos >= 1 (cos | sin)"), cos_sin.shape_str());
  require_contiguous(cos_sin, "cos_sin");
  detail::require_aligned(cos_sin.data, "cos_sin", 16);
}

void qkv_front_impl::check_cache(const TensorRef& kv_cache, int kvh, int device) {
  require_tensor(kv_cache, "kv_cache", DType::kBFloat16, device);
  if (kv_cache.ndim != 4 || kv_cache.shape[0] < 1 || kv_cache.shape[1] != kvh || kv_cache.shape[2] != kPageSize ||
      kv_cache.shape[3] != kCacheRowWidth)
    fail_expected("kv_cache",
                  cat("[pages, ", kvh, ", ", kPageSize, ", ", kCacheRowWidth, "] (num_kv_heads = ", kvh, ")"),
                  kv_cache.shape_str());
  require_contiguous(kv_cache, "kv_cache");
  detail::require_aligned(kv_cache.data, "kv_cache", 16);
}

namespace {

using qkv_front_impl::check_cache;
using qkv_front_impl::check_cos_sin;
using qkv_front_impl::check_weight;

// The workspace of a launch on `device` (any dtype: it is bytes).
void check_workspace(const TensorRef& ws, int kvh, int device) {
  require_tensor(ws, "workspace", ws.dtype, device);
  const int sms = sms_of(device);
  const int64_t need = qkv_front_workspace_bytes(kvh, std::max(sms, 1));
  const int64_t have = ws.contiguous() ? ws.numel() * dtype_size(ws.dtype) : 0;
  if (ws.ndim != 1 || have < need)
    fail_expected("workspace",
                  cat("a contiguous 1-D buffer of at least ", need, " bytes (qkv_front_workspace_bytes for ", kvh,
                      " KV heads, ", sms, " SMs)"),
                  cat(ws.shape_str(), " of ", dtype_name(ws.dtype), ", ", have, " bytes"));
  detail::require_aligned(ws.data, "workspace", 16);
}

// Every check of a call, in the order of the arguments; out and workspace
// only where given unless `complete` (check_qkv_front).
qkv_front_impl::Params check_call(const QkvFrontArgs& a, bool complete) {
  using detail::require_disjoint;
  // x decides the device and the number of tokens.
  const TensorRef& x = a.x;
  require_tensor(x, "x", DType::kBFloat16, -1);
  const int dev = x.device;
  if (x.ndim != 2 || x.shape[0] < 1 || x.shape[0] > kFrontMaxTokens || x.shape[1] != kHiddenSize)
    fail_expected("x", cat("[T, ", kHiddenSize, "] with 1 <= T <= ", kFrontMaxTokens), x.shape_str());
  require_rows16(x, "x", kHiddenSize);
  const int64_t T = x.shape[0];

  const int kvh = a.num_kv_heads;
  require_kv_heads(kvh);
  const int64_t N = qkv_width(kvh);
  check_weight(a.weight, "weight", kvh, dev);

  require_tensor(a.positions, "positions", DType::kInt64, dev);
  require_contiguous_1d(a.positions, "positions", T, "one per token of x");
  check_cos_sin(a.cos_sin, dev);
  require_tensor(a.slot_mapping, "slot_mapping", DType::kInt64, dev);
  require_contiguous_1d(a.slot_mapping, "slot_mapping", T, "one per token of x");
  check_cache(a.kv_cache, kvh, dev);

  // Written: out and the cache must not alias anything read.
  const std::pair<const TensorRef*, const char*> inputs[] = {{&x, "x"},
                                                             {&a.weight, "weight"},
                                                             {&a.positions, "positions"},
                                                             {&a.cos_sin, "cos_sin"},
                                                             {&a.slot_mapping, "slot_mapping"}};
  const TensorRef& out = a.out;
  const bool with_out = complete || out.present();
  if (with_out) {
    require_tensor(out, "out", DType::kBFloat16, dev);
    if (out.ndim != 2 || out.shape[0] != T || out.shape[1] != N)
      fail_expected("out", cat("[", T, ", ", N, "] (tokens of x, qkv width)"), out.shape_str());
    require_rows16(out, "out", N);
    for (const auto& [t, name] : inputs) require_disjoint(out, "out", *t, name);
    require_disjoint(out, "out", a.kv_cache, "kv_cache");
  }
  for (const auto& [t, name] : inputs) require_disjoint(a.kv_cache, "kv_cache", *t, name);

  // The workspace last: its size depends on the device the call runs on.
  const TensorRef& ws = a.workspace;
  const bool with_ws = complete || ws.present();
  if (with_ws) {
    check_workspace(ws, kvh, dev);
    for (const auto& [t, name] : inputs) require_disjoint(ws, "workspace", *t, name);
    require_disjoint(ws, "workspace", a.kv_cache, "kv_cache");
    require_disjoint(ws, "workspace", out, "out");
  }

  qkv_front_impl::Params p;
  p.x = x.data;
  p.x_stride = T > 1 ? x.stride[0] : kHiddenSize;
  p.weight = a.weight.data;
  p.positions = static_cast<const int64_t*>(a.positions.data);
  p.cos_sin = a.cos_sin.present() ? static_cast<const float*>(a.cos_sin.data) : nullptr;
  p.max_pos = a.cos_sin.present() ? a.cos_sin.shape[0] : 0;
  p.slot_mapping = static_cast<const int64_t*>(a.slot_mapping.data);
  p.kv_cache = a.kv_cache.data;
  p.num_slots = a.kv_cache.shape[0] * kPageSize;
  if (with_out) {
    p.out = out.data;
    p.out_stride = T > 1 ? out.stride[0] : N;
  }
  if (with_ws) {
    p.workspace = ws.data;
    p.num_ctas = qkv_front_ctas(kvh, std::max(sms_of(dev), 1));
  }
  p.num_tokens = static_cast<int>(T);
  p.num_kv_heads = kvh;
  p.pdl = a.pdl;
  return p;
}

}  // namespace

bool qkv_front_supports_shape(int n, int num_kv_heads) {
  return detail::supported_kv_heads(num_kv_heads) && n == qkv_width(num_kv_heads);
}

int qkv_front_ctas(int num_kv_heads, int sm_count) {
  require_kv_heads(num_kv_heads);
  if (sm_count < 1) fail_expected("sm_count", "at least 1", sm_count);
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
  device = detail::resolve_device(device);
  require_kv_heads(num_kv_heads);
  const int sms = sms_of(device);
  if (sms < 1)
    fail(cat("qkv_front_workspace_bytes_for_device needs a CUDA device to size for: ", describe_device(device)));
  return qkv_front_workspace_bytes(num_kv_heads, sms);
}

QkvColumns qkv_front_columns(int num_kv_heads) {
  require_kv_heads(num_kv_heads);
  const int64_t q_width = int64_t{kHeadsPerKvHead} * num_kv_heads * kHeadDim;
  const int64_t kv_width = int64_t{num_kv_heads} * kHeadDim;
  return QkvColumns{q_width, q_width + kv_width, q_width + 2 * kv_width, 2 * q_width + 2 * kv_width};
}

QkvViews split_qkv(const TensorRef& qkv, int num_kv_heads) {
  const QkvColumns c = qkv_front_columns(num_kv_heads);
  if (!qkv.present() || qkv.ndim != 2 || qkv.shape[1] != c.width)
    fail(expected_text("qkv", cat("[tokens, ", c.width, "] for ", num_kv_heads, " KV heads"), qkv.shape_str()));
  QkvViews v;
  v.q = qkv;
  v.q.shape[1] = c.k;
  v.gate = qkv;
  v.gate.shape[1] = c.width - c.gate;
  v.gate.data = static_cast<char*>(qkv.data) + c.gate * qkv.stride[1] * dtype_size(qkv.dtype);
  return v;
}

std::optional<std::string> unsupported_projection(const ProjectionDesc& a) {
  if (a.quantized) return std::string("a quantized QKV projection (the front reads an unquantized bf16 weight)");
  if (a.has_bias) return std::string("a QKV projection with a bias (the front adds none)");
  if (a.gather_output && a.tp_size > 1)
    return cat("a QKV projection that gathers its output over TP ", a.tp_size,
               " (the front writes this rank's columns)");
  if (a.head_dim != kHeadDim) return cat("head_dim ", a.head_dim, " (the front is built for ", kHeadDim, ")");
  if (!detail::supported_kv_heads(a.num_kv_heads))
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

// ---------------------------------------------------------------------------
// Per-call checks.
std::optional<std::string> unsupported_qkv_front_call(const QkvFrontArgs& args) {
  return detail::reason_of([&] { check_call(args, false); });
}

bool qkv_front_supports_call(const QkvFrontArgs& args) { return !unsupported_qkv_front_call(args); }

void check_qkv_front(const QkvFrontArgs& args) { check_call(args, true); }

qkv_front_impl::Params qkv_front_impl::params_of(const QkvFrontArgs& args) { return check_call(args, true); }

// ---------------------------------------------------------------------------
// Device setup and launch.
void prepare_qkv_front(int device) {
  detail::prepare_device(g_prepared, "qkv_front", device, [](int d) {
    detail::throw_if_cuda_error(qkv_front_impl::set_kernel_attributes(),
                                "prepare_qkv_front: setting the kernel attributes");
    QkvFrontDevice s;
    s.sms = sm_count(d);
    return s;
  });
}

void qkv_front(const QkvFrontArgs& args, Stream stream) {
  const qkv_front_impl::Params p = qkv_front_impl::params_of(args);
  detail::require_prepared(g_prepared, "qkv_front", args.x.device);
  detail::throw_if_cuda_error(qkv_front_impl::launch(p, stream), "qkv_front: kernel launch");
}

// ---------------------------------------------------------------------------
// The bound form: the layer's tensors are checked here, once; the weight
// decides the device.
QkvFront::QkvFront(const TensorRef& weight, const TensorRef& cos_sin, const TensorRef& kv_cache, int num_kv_heads,
                   const TensorRef& workspace)
    : weight_(weight), cos_sin_(cos_sin), kv_cache_(kv_cache), workspace_(workspace), num_kv_heads_(num_kv_heads) {
  using detail::require_disjoint;
  require_kv_heads(num_kv_heads);
  qkv_front_impl::check_weight(weight, "weight", num_kv_heads, -1);
  const int dev = weight.device;
  qkv_front_impl::check_cos_sin(cos_sin, dev);
  qkv_front_impl::check_cache(kv_cache, num_kv_heads, dev);
  check_workspace(workspace, num_kv_heads, dev);
  require_disjoint(kv_cache, "kv_cache", weight, "weight");
  require_disjoint(kv_cache, "kv_cache", cos_sin, "cos_sin");
  require_disjoint(workspace, "workspace", weight, "weight");
  require_disjoint(workspace, "workspace", cos_sin, "cos_sin");
  require_disjoint(workspace, "workspace", kv_cache, "kv_cache");
  prepare_qkv_front(dev);
}

QkvFrontArgs QkvFront::args(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                            const TensorRef& out, bool pdl) const {
  QkvFrontArgs a;
  a.x = x;
  a.weight = weight_;
  a.positions = positions;
  a.cos_sin = cos_sin_;
  a.slot_mapping = slot_mapping;
  a.kv_cache = kv_cache_;
  a.num_kv_heads = num_kv_heads_;
  a.out = out;
  a.workspace = workspace_;
  a.pdl = pdl;
  return a;
}

void QkvFront::operator()(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                          const TensorRef& out, Stream stream, bool pdl) const {
  qkv_front(args(x, positions, slot_mapping, out, pdl), stream);
}

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the kernels' entries
// with cudaErrorNotSupported.
namespace muse_decode::qkv_front_impl {
int launch(const Params&, Stream) { return detail::kCudaErrorNotSupported; }
int set_kernel_attributes() { return detail::kCudaErrorNotSupported; }
}  // namespace muse_decode::qkv_front_impl
#endif
