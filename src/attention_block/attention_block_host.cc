// attention_block host layer: where the block serves, the sizing of its key
// slices and workspace, the layer check composed of the three ops' own, the
// per-call checks that guard the launch (the ops' checks of the tensors the
// block shares with them, under the block's argument names), the device
// setup, the launch and the bound form.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "../attn2/params.h"
#include "../common/checks.h"
#include "../common/hardware.h"
#include "../o_proj/params.h"
#include "../qkv_front/params.h"
#include "muse_decode/arch.h"
#include "muse_decode/attention_block.h"
#include "params.h"

namespace muse_decode {

using detail::cat;
using detail::fail_expected;
using detail::require_contiguous_1d;
using detail::require_disjoint;
using detail::require_rows16;
using detail::require_tensor;

static_assert(attention_block_impl::kShares == kAttentionBlockShares, "the kernel deals the shares the API names");
static_assert(attention_block_impl::kTokenGroup == kFrontMaxTokens,
              "the front's token group is the rows one qkv_front tile takes");
static_assert(kAttentionBlockMaxReqs * kVerifyLen == kOProjMaxTokens, "8 requests of 8 rows are o_proj's 64 rows");

namespace {

constexpr int kMaxRows = kAttentionBlockMaxReqs * kVerifyLen;  // 64
constexpr int kRowsPerPair = kVerifyLen * kHeadsPerKvHead;     // 64 rows of one (request, KV head)

void require_kv_heads(int kvh) {
  if (!attention_block_supports_kv_heads(kvh)) fail_expected("num_kv_heads", "2 or 4 (TP8 or TP4)", kvh);
}

void check_num_reqs(int num_reqs) {
  if (num_reqs < 1 || num_reqs > kAttentionBlockMaxReqs)
    fail_expected("num_reqs", cat("in [1, ", kAttentionBlockMaxReqs, "]"), num_reqs);
}

// What the sizing functions take, checked as a call checks it.
void check_sizing(int num_reqs, int kvh, int max_model_len, int window) {
  check_num_reqs(num_reqs);
  require_kv_heads(kvh);
  attn2_impl::check_max_model_len(max_model_len);
  attn2_impl::check_window(window, max_model_len);
}

// Params holds the page count as int (as attn2's does).
void check_pages(const TensorRef& kv_cache) {
  if (kv_cache.shape[0] > INT32_MAX) fail_expected("kv_cache pages", "at most 2^31 - 1", kv_cache.shape[0]);
}

// The workspace of a call of num_reqs requests (any dtype: it is bytes), on `device`.
void check_workspace(const TensorRef& ws, int num_reqs, int kvh, int max_model_len, int window, int device) {
  require_tensor(ws, "workspace", ws.dtype, device);
  const int64_t need = attention_block_workspace_bytes(num_reqs, kvh, max_model_len, window);
  const bool contiguous = ws.contiguous();
  const int64_t have = contiguous ? ws.numel() * dtype_size(ws.dtype) : 0;
  if (ws.ndim != 1 || !contiguous || have < need)
    fail_expected("workspace",
                  cat("a contiguous 1-D buffer of at least ", need, " bytes (attention_block_workspace_bytes(",
                      num_reqs, ", ", kvh, ", ", max_model_len, ", ", window, "))"),
                  contiguous ? cat(ws.shape_str(), " of ", dtype_name(ws.dtype), ", ", have, " bytes")
                             : cat(ws.shape_str(), " of ", dtype_name(ws.dtype), " with strides ",
                                   detail::strides_str(ws)));
  detail::require_aligned(ws.data, "workspace", 16);
}

// Every check of a call, in the order of the arguments (num_kv_heads before
// the tensors it shapes, max_model_len and window before the block table they
// size); out and workspace only where given unless `complete`
// (check_attention_block). The grid is params_of's.
attention_block_impl::Params check_call(const AttentionBlockArgs& a, bool complete) {
  // x decides the device and the requests.
  const TensorRef& x = a.x;
  require_tensor(x, "x", DType::kBFloat16, -1);
  const int dev = x.device;
  if (x.ndim != 2 || x.shape[0] < kVerifyLen || x.shape[0] > kMaxRows || x.shape[0] % kVerifyLen != 0 ||
      x.shape[1] != kHiddenSize)
    fail_expected("x", cat("[R*8, ", kHiddenSize, "] with 1 <= R <= ", kAttentionBlockMaxReqs, " (", kVerifyLen,
                           " rows per request)"),
                  x.shape_str());
  require_rows16(x, "x", kHiddenSize);
  const int64_t T = x.shape[0];
  const int reqs = static_cast<int>(T / kVerifyLen);

  // qkv_front's tensors.
  const int kvh = a.num_kv_heads;
  require_kv_heads(kvh);
  qkv_front_impl::check_weight(a.qkv_weight, "qkv_weight", kvh, dev);
  require_tensor(a.positions, "positions", DType::kInt64, dev);
  require_contiguous_1d(a.positions, "positions", T, "one per row of x");
  qkv_front_impl::check_cos_sin(a.cos_sin, dev);
  require_tensor(a.slot_mapping, "slot_mapping", DType::kInt64, dev);
  require_contiguous_1d(a.slot_mapping, "slot_mapping", T, "one per row of x");
  qkv_front_impl::check_cache(a.kv_cache, kvh, dev);
  check_pages(a.kv_cache);

  // attn2's.
  attn2_impl::check_max_model_len(a.max_model_len);
  attn2_impl::check_window(a.window, a.max_model_len);
  attn2_impl::check_block_table(a.block_table, reqs, a.max_model_len, dev);
  const TensorRef& sl = a.seq_lens;
  require_tensor(sl, "seq_lens", DType::kInt32, dev);
  require_contiguous_1d(sl, "seq_lens", reqs, "one per request: x's rows / 8");
  detail::require_aligned(sl.data, "seq_lens", 4);

  // o_proj's.
  const int64_t K = o_proj_in_width(kvh);
  o_proj_impl::check_weight(a.o_proj_weight, "o_proj_weight", K, cat("for ", kvh, " KV heads"), dev);

  // Written: the cache, out and the workspace must not alias anything read.
  const std::pair<const TensorRef*, const char*> inputs[] = {
      {&x, "x"},
      {&a.qkv_weight, "qkv_weight"},
      {&a.positions, "positions"},
      {&a.cos_sin, "cos_sin"},
      {&a.slot_mapping, "slot_mapping"},
      {&a.block_table, "block_table"},
      {&a.seq_lens, "seq_lens"},
      {&a.o_proj_weight, "o_proj_weight"}};
  for (const auto& [t, name] : inputs) require_disjoint(a.kv_cache, "kv_cache", *t, name);

  const TensorRef& out = a.out;
  const bool with_out = complete || out.present();
  if (with_out) {
    require_tensor(out, "out", DType::kBFloat16, dev);
    if (out.ndim != 2 || out.shape[0] != T || out.shape[1] != kHiddenSize)
      fail_expected("out", cat("[", T, ", ", kHiddenSize, "] (rows of x, hidden size)"), out.shape_str());
    require_rows16(out, "out", kHiddenSize);
    for (const auto& [t, name] : inputs) require_disjoint(out, "out", *t, name);
    require_disjoint(out, "out", a.kv_cache, "kv_cache");
  }

  // The workspace last: its size follows from everything above.
  const TensorRef& ws = a.workspace;
  const bool with_ws = complete || ws.present();
  if (with_ws) {
    check_workspace(ws, reqs, kvh, a.max_model_len, a.window, dev);
    for (const auto& [t, name] : inputs) require_disjoint(ws, "workspace", *t, name);
    require_disjoint(ws, "workspace", a.kv_cache, "kv_cache");
    require_disjoint(ws, "workspace", out, "out");
  }

  attention_block_impl::Params p;
  p.x = x.data;
  p.x_stride = x.stride[0];
  p.qkv_weight = a.qkv_weight.data;
  p.positions = static_cast<const int64_t*>(a.positions.data);
  p.cos_sin = a.cos_sin.present() ? static_cast<const float*>(a.cos_sin.data) : nullptr;
  p.max_pos = a.cos_sin.present() ? a.cos_sin.shape[0] : 0;
  p.slot_mapping = static_cast<const int64_t*>(a.slot_mapping.data);
  p.kv_cache = a.kv_cache.data;
  p.num_pages = static_cast<int>(a.kv_cache.shape[0]);
  p.block_table = static_cast<const int32_t*>(a.block_table.data);
  p.block_table_stride = reqs > 1 ? a.block_table.stride[0] : a.block_table.shape[1];
  p.seq_lens = static_cast<const int32_t*>(sl.data);
  p.o_weight = a.o_proj_weight.data;
  if (with_out) {
    p.out = out.data;
    p.out_stride = out.stride[0];
  }
  if (with_ws) p.workspace = ws.data;
  p.num_reqs = reqs;
  p.num_kv_heads = kvh;
  p.max_model_len = a.max_model_len;
  p.window = a.window;
  p.num_splits = attention_block_impl::splits_of(reqs, kvh, a.max_model_len, a.window);
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------
// Where it serves, and the sizing.

// The front's stream-K and o_proj's tiles are dealt for 2 and 4 KV heads
// (TP8, TP4): 36 and 72 tiles of the front, 16 and 32 query heads of
// attention over the 132 shares. Other counts keep the three ops.
bool attention_block_supports_kv_heads(int num_kv_heads) { return num_kv_heads == 2 || num_kv_heads == 4; }

// Key slices per (request, KV head). The attention phase deals its shares
// evenly over the R * KVH pairs, and a slice is at least one 8-page group of
// the longest row (a slice of fewer keys would only add a partial to merge):
//   TP8, 1 request, full 32k:  132 / 2 = 66 shares; 2048 pages = 256 groups -> 66 slices of ~31 pages
//   sliding 2048 at 32k:       2048 + 7 = 2055 keys, 129 pages, 17 groups   -> 17 slices
//   max_model_len 2048:        128 pages, 16 groups                         -> 16 slices
//   TP4, 8 requests:           132 / 32 = 4 shares per pair                 -> 4 slices
int attention_block_impl::splits_of(int num_reqs, int num_kv_heads, int max_model_len, int window) {
  // The last of the 8 new rows sees W keys; the first row's window starts 7 before it.
  const int64_t keys = window > 0 ? std::min<int64_t>(max_model_len, int64_t{window} + kVerifyLen - 1) : max_model_len;
  const int64_t pages = (keys + kPageSize - 1) / kPageSize;
  const int64_t groups = (pages + kMinSlicePages - 1) / kMinSlicePages;
  const int64_t pairs = int64_t{num_reqs} * num_kv_heads;
  const int64_t fill = pairs > 0 ? kShares / pairs : kShares;
  return static_cast<int>(std::max<int64_t>(1, std::min(fill, std::max<int64_t>(1, groups))));
}

int attention_block_splits(int num_reqs, int num_kv_heads, int max_model_len, int window) {
  check_sizing(num_reqs, num_kv_heads, max_model_len, window);
  return attention_block_impl::splits_of(num_reqs, num_kv_heads, max_model_len, window);
}

attention_block_impl::WorkspaceLayout attention_block_impl::workspace_layout(int num_reqs, int num_kv_heads,
                                                                             int num_splits) {
  const auto align = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t T = int64_t{num_reqs} * kVerifyLen;
  const int64_t N = qkv_width(num_kv_heads), K = o_proj_in_width(num_kv_heads);
  const int64_t tiles = N / qkv_front_impl::kFrontTileRows;
  const int64_t groups = (T + kTokenGroup - 1) / kTokenGroup;
  WorkspaceLayout w{};
  w.counters = 0;
  int64_t end = int64_t{kCounterWords} * 4;
  // One qkv_front merge per token group (its WorkspaceMerge: the tile
  // counters rounded to 256 bytes, then the 4 KB partial of tile + share).
  w.front = align(end);
  w.front_group_bytes = align(tiles * 4) + (tiles + kShares) * qkv_front_impl::kFrontPartialBytes;
  end = w.front + groups * w.front_group_bytes;
  w.qkv = align(end);
  end = w.qkv + T * N * 2;
  // Per (request, KV head, slice): 64 rows of (m, l) and 64 floats of O, as attn2's partials.
  w.attn_part = align(end);
  end = w.attn_part + attn2_impl::partial_bytes(int64_t{num_reqs} * num_kv_heads * num_splits * kRowsPerPair);
  w.attn_out = align(end);
  end = w.attn_out + T * K * 2;
  w.total = end;
  return w;
}

// The largest layout of 1 to num_reqs requests, so that a workspace sized
// for a deployment's most requests serves every step: the layout alone is
// not monotone in R, as the slices per request shrink while R grows (TP8 at
// 32k: 3 requests of 22 slices take 3770880 bytes, 4 of 16 take 3756544).
int64_t attention_block_workspace_bytes(int num_reqs, int num_kv_heads, int max_model_len, int window) {
  check_sizing(num_reqs, num_kv_heads, max_model_len, window);
  int64_t bytes = 0;
  for (int r = 1; r <= num_reqs; ++r) {
    const int splits = attention_block_impl::splits_of(r, num_kv_heads, max_model_len, window);
    bytes = std::max(bytes, attention_block_impl::workspace_layout(r, num_kv_heads, splits).total);
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// The layer: the three ops' own checks, then the block's.
std::optional<std::string> unsupported_attention_block(const AttentionBlockLayer& layer) {
  if (auto why = unsupported_projection(layer.projection)) return why;
  if (auto why = unsupported_attn2(layer.attention)) return why;
  if (auto why = unsupported_o_proj(layer.output)) return why;
  const int kvh = layer.num_kv_heads;
  if (!attention_block_supports_kv_heads(kvh))
    return cat(kvh, " KV heads per rank (the block serves 2 or 4: TP8 or TP4)");
  if (layer.projection.num_kv_heads != kvh)
    return cat("a QKV projection of ", layer.projection.num_kv_heads, " KV heads on a rank of ", kvh);
  if (layer.attention.num_kv_heads != kvh)
    return cat("an attention of ", layer.attention.num_kv_heads, " KV heads on a rank of ", kvh);
  if (layer.output.num_heads != kHeadsPerKvHead * kvh)
    return cat("an output projection of ", layer.output.num_heads, " query heads on a rank of ", kvh,
               " KV heads (the block needs ", kHeadsPerKvHead * kvh, ")");
  if (layer.max_reqs < 1 || layer.max_reqs > kAttentionBlockMaxReqs)
    return cat("max_reqs ", layer.max_reqs, " (the block serves 1 to ", kAttentionBlockMaxReqs, " requests)");
  if (layer.max_model_len < kVerifyLen)
    return cat("max_model_len ", layer.max_model_len, " (the block needs at least ", kVerifyLen,
               ", one verify step)");
  return detail::reason_of([&] { attn2_window(layer.sliding_window, layer.max_model_len); });
}

// ---------------------------------------------------------------------------
// Per-call checks.
std::optional<std::string> unsupported_attention_block_call(const AttentionBlockArgs& args) {
  return detail::reason_of([&] { check_call(args, false); });
}

bool attention_block_supports_call(const AttentionBlockArgs& args) { return !unsupported_attention_block_call(args); }

void check_attention_block(const AttentionBlockArgs& args) { check_call(args, true); }

attention_block_impl::Params attention_block_impl::params_of(const AttentionBlockArgs& args, int grid) {
  Params p = check_call(args, true);
  if (grid < 1 || grid > kShares)
    fail_expected("grid", cat("in [1, ", kShares, "] (one CTA per SM, at most kAttentionBlockShares)"), grid);
  p.grid = grid;
  p.ws = workspace_layout(p.num_reqs, p.num_kv_heads, p.num_splits);
  return p;
}

// ---------------------------------------------------------------------------
// Device setup and launch.
namespace {
// Prepared devices: the CTAs the cooperative launch takes there.
struct AttentionBlockDevice {
  int grid = 0;
};
detail::PerDevice<AttentionBlockDevice> g_prepared;
}  // namespace

void prepare_attention_block(int device) {
  detail::prepare_device(g_prepared, "attention_block", device, [](int d) {
    AttentionBlockDevice s;
    detail::throw_if_cuda_error(attention_block_impl::set_kernel_attributes(&s.grid),
                                "prepare_attention_block: setting the kernel attributes");
    // A cooperative launch needs every CTA resident: with none per SM it cannot run.
    if (s.grid < 1)
      throw std::runtime_error(cat("prepare_attention_block: one CTA of the kernel per SM does not fit on ",
                                   describe_device(d), " (its cooperative launch needs every CTA resident)"));
    return s;
  });
}

void attention_block(const AttentionBlockArgs& args, Stream stream) {
  const AttentionBlockDevice* d = g_prepared.find(args.x.device);
  if (d == nullptr) {  // the arguments' reason first, then the missing prepare
    check_attention_block(args);
    d = &detail::require_prepared(g_prepared, "attention_block", args.x.device);
  }
  detail::throw_if_cuda_error(attention_block_impl::launch(attention_block_impl::params_of(args, d->grid), stream),
                              "attention_block: kernel launch");
}

// ---------------------------------------------------------------------------
// The bound form: the layer's tensors and the deployment are checked here,
// once; the QKV weight decides the device.
AttentionBlock::AttentionBlock(const TensorRef& qkv_weight, const TensorRef& cos_sin, const TensorRef& kv_cache,
                               int num_kv_heads, const TensorRef& o_proj_weight, int max_model_len, int window,
                               const TensorRef& workspace)
    : qkv_weight_(qkv_weight), cos_sin_(cos_sin), kv_cache_(kv_cache), o_proj_weight_(o_proj_weight),
      workspace_(workspace), num_kv_heads_(num_kv_heads), max_model_len_(max_model_len), window_(window) {
  require_kv_heads(num_kv_heads);
  qkv_front_impl::check_weight(qkv_weight, "qkv_weight", num_kv_heads, -1);
  const int dev = qkv_weight.device;
  qkv_front_impl::check_cos_sin(cos_sin, dev);
  qkv_front_impl::check_cache(kv_cache, num_kv_heads, dev);
  check_pages(kv_cache);
  o_proj_impl::check_weight(o_proj_weight, "o_proj_weight", o_proj_in_width(num_kv_heads),
                            cat("for ", num_kv_heads, " KV heads"), dev);
  attn2_impl::check_max_model_len(max_model_len);
  attn2_impl::check_window(window, max_model_len);
  // What one request needs; a call checks its own requests' size.
  check_workspace(workspace, 1, num_kv_heads, max_model_len, window, dev);
  require_disjoint(kv_cache, "kv_cache", qkv_weight, "qkv_weight");
  require_disjoint(kv_cache, "kv_cache", cos_sin, "cos_sin");
  require_disjoint(kv_cache, "kv_cache", o_proj_weight, "o_proj_weight");
  require_disjoint(workspace, "workspace", qkv_weight, "qkv_weight");
  require_disjoint(workspace, "workspace", cos_sin, "cos_sin");
  require_disjoint(workspace, "workspace", kv_cache, "kv_cache");
  require_disjoint(workspace, "workspace", o_proj_weight, "o_proj_weight");
  prepare_attention_block(dev);
}

AttentionBlockArgs AttentionBlock::args(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                                        const TensorRef& block_table, const TensorRef& seq_lens,
                                        const TensorRef& out) const {
  AttentionBlockArgs a;
  a.x = x;
  a.qkv_weight = qkv_weight_;
  a.positions = positions;
  a.cos_sin = cos_sin_;
  a.slot_mapping = slot_mapping;
  a.kv_cache = kv_cache_;
  a.num_kv_heads = num_kv_heads_;
  a.block_table = block_table;
  a.seq_lens = seq_lens;
  a.max_model_len = max_model_len_;
  a.window = window_;
  a.o_proj_weight = o_proj_weight_;
  a.out = out;
  a.workspace = workspace_;
  return a;
}

void AttentionBlock::operator()(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                                const TensorRef& block_table, const TensorRef& seq_lens, const TensorRef& out,
                                Stream stream) const {
  attention_block(args(x, positions, slot_mapping, block_table, seq_lens, out), stream);
}

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the kernel's entries
// with cudaErrorNotSupported.
namespace muse_decode::attention_block_impl {
int launch(const Params&, Stream) { return detail::kCudaErrorNotSupported; }
int set_kernel_attributes(int* grid) {
  if (grid != nullptr) *grid = 0;
  return detail::kCudaErrorNotSupported;
}
}  // namespace muse_decode::attention_block_impl
#endif
