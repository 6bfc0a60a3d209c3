// attn2 host layer: sizing, the layer check, the per-call argument checks
// that guard the launch, the device setup, the launch and the bound form.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "../common/checks.h"
#include "../common/hardware.h"
#include "muse_decode/arch.h"
#include "muse_decode/attn2.h"
#include "params.h"

namespace muse_decode {

using detail::cat;
using detail::fail;
using detail::fail_expected;

namespace {
constexpr int kRowsPerPair = kVerifyLen * kHeadsPerKvHead;  // 64
constexpr int kMaxGridYZ = 65535;

// Split-path heuristic. 2 CTAs fit per SM (107.9 KB of shared memory + 1.7 KB
// static each). A slice is a cluster of CTAs; the residency says how many
// CTAs of the kernel the GPU co-schedules with clusters of 8 and of 16 (an
// H200: 240 and 224; a cluster stays inside one GPC). More CTAs than that per
// request start a second wave, which doubles the time of a one-request step
// (16 TP8 slices of 8 = 256 CTAs took 24 us at L = 32k, two waves of ~12).
// With 1-2 KV heads (TP8) a slice is a cluster of 16: half the slices, so
// half the partials to merge through the workspace, and the one-slice range
// (merged in the cluster only) reaches twice as far in L (H200, PDL: 2k 5.0
// against 6.0 us, 32k 12.1 against 14.3 with clusters of 8). On an H200:
//   TP8, KVH 2:  224 / (16 * 2) =  7 slices of 16 -> 224 CTAs (one wave)
//   KVH 1:       14 slices of 16
//   TP4, KVH 4:  240 / (8 * 4)  =  7 slices of 8  -> 224 CTAs
//   KVH 3:       240 / (8 * 3)  = 10 slices of 8  -> 240 CTAs
//   TP1, KVH 16: 240 / (8 * 16) =  1 -> raised to 2: 256 CTAs per request. With
//     8 requests (the TP1 shape we serve) 2048 CTAs make 8.5 waves, against 4.3
//     for one slice (a 0.3-full last wave of twice-as-long CTAs); one request
//     at TP1 pays a second wave.
// and never more slices than the longest request fills with one 8-page group
// (128 keys) per CTA: max_model_len 4096 -> 32 groups -> 2 slices of 16.
constexpr int kMinSplits = 2;
constexpr int kGroupKeys = 8 * kPageSize;
int split_cluster(int num_kv_heads) { return num_kv_heads <= 2 ? 16 : 8; }
int resident_ctas(const Attn2Residency& r, int cluster) { return cluster == 16 ? r.resident_ctas_16 : r.resident_ctas_8; }

// attn2 serves any KV-head count of a rank of Muse Spark's 16.
constexpr int kMaxKvHeads = kNumKvHeads;
void require_kv_heads(int64_t kvh, std::string_view name = "num_kv_heads") {
  if (kvh < 1 || kvh > kMaxKvHeads) fail_expected(name, cat("in [1, ", kMaxKvHeads, "]"), kvh);
}
}  // namespace

// The deployment's scalars, each checked where it is taken: they size
// everything else.
void attn2_impl::check_max_model_len(int max_model_len) {
  if (max_model_len < kVerifyLen) fail_expected("max_model_len", cat("at least ", kVerifyLen), max_model_len);
}

void attn2_impl::check_window(int window, int max_model_len) {
  if (window < 0 || (window != 0 && window >= max_model_len))
    fail_expected("window", "0 or in [1, max_model_len) (see attn2_window)", window);
}

namespace {
using attn2_impl::check_max_model_len;
using attn2_impl::check_window;

void check_num_splits(int num_splits) {
  if (num_splits < 1 || num_splits > kAttn2MaxSplits)
    fail_expected("num_splits", cat("in [1, ", kAttn2MaxSplits, "]"), num_splits);
}

void check_deployment(int max_model_len, int window, int num_splits) {
  check_max_model_len(max_model_len);
  check_window(window, max_model_len);
  check_num_splits(num_splits);
}
}  // namespace

int attn2_window(std::optional<int> sliding_window, int max_model_len) {
  if (sliding_window && *sliding_window < 1)
    fail_expected("sliding_window", "at least 1 (or none)", *sliding_window);
  check_max_model_len(max_model_len);
  if (!sliding_window || *sliding_window >= max_model_len) return 0;
  return *sliding_window;
}

int attn2_splits(int max_model_len, int window, int num_kv_heads, const Attn2Residency& residency) {
  check_max_model_len(max_model_len);
  check_window(window, max_model_len);
  require_kv_heads(num_kv_heads);
  if (window != 0 || max_model_len <= kAttn2ShortMaxLen) return 1;
  const int cluster = split_cluster(num_kv_heads);
  const int fill = std::max(kMinSplits, resident_ctas(residency, cluster) / (cluster * num_kv_heads));
  const int64_t groups = (static_cast<int64_t>(max_model_len) + kGroupKeys - 1) / kGroupKeys;
  const int64_t useful = (groups + cluster - 1) / cluster;
  int64_t s = fill < useful ? fill : useful;
  if (s > kAttn2MaxSplits) s = kAttn2MaxSplits;
  return s < 1 ? 1 : static_cast<int>(s);
}

int attn2_splits(int max_model_len, int window, int num_kv_heads) {
  Attn2Residency r = kH200Attn2Residency;
  if (supported_family(gpu_family(detail::resolve_device(-1)))) {
    prepare_attn2(-1);
    r = attn2_residency(-1);
  }
  return attn2_splits(max_model_len, window, num_kv_heads, r);
}

int64_t attn2_workspace_bytes(int num_reqs, int num_kv_heads, int num_splits) {
  if (num_reqs < 1 || num_reqs > kMaxGridYZ) fail_expected("num_reqs", cat("in [1, ", kMaxGridYZ, "]"), num_reqs);
  require_kv_heads(num_kv_heads);
  check_num_splits(num_splits);
  if (num_splits == 1) return 0;
  const int64_t pairs = static_cast<int64_t>(num_reqs) * num_kv_heads;
  return attn2_impl::counter_bytes(pairs) + attn2_impl::partial_bytes(pairs * num_splits * kRowsPerPair);
}

std::optional<std::string> unsupported_attn2(const Attn2Layer& layer) {
  if (!(layer.use_o_norm && layer.use_o_gate)) return std::string("the layer has no o-norm with a sigmoid o-gate");
  if (layer.head_dim != kHeadDim) return cat("head_dim ", layer.head_dim, " (the kernel has ", kHeadDim, ")");
  if (layer.num_kv_heads < 1 || layer.num_kv_heads > kMaxKvHeads)
    return cat(layer.num_kv_heads, " KV heads per rank (the kernel serves 1 to ", kMaxKvHeads, ")");
  if (layer.num_heads != kHeadsPerKvHead * layer.num_kv_heads)
    return cat(layer.num_heads, " query heads for ", layer.num_kv_heads, " KV heads (the kernel has ",
               kHeadsPerKvHead, " per KV head)");
  if (static_cast<float>(layer.scaling) != kSoftmaxScale)
    return cat("softmax scale ", layer.scaling, " (the kernel is built for 0.6841258107984375)");
  if (static_cast<float>(layer.rms_norm_eps) != kRmsNormEps)
    return cat("o-norm eps ", layer.rms_norm_eps, " (the kernel is built for 1e-05)");
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Per-call checks.
namespace {

void require_rows(const TensorRef& t, std::string_view name, int64_t rows, int64_t width) {
  using namespace detail;
  require_present(t, name);
  require_dtype(t, name, DType::kBFloat16);
  if (t.ndim != 2 || t.shape[0] != rows || t.shape[1] != width)
    fail_expected(name, cat("[", rows, ", ", width, "] (R * 8 rows, 8 * KVH heads of 64)"), t.shape_str());
  if (t.stride[1] != 1) fail_expected(name, "unit column stride", cat("stride ", t.stride[1]));
  if (t.stride[0] < width || t.stride[0] % 8 != 0)
    fail_expected(cat(name, " row stride"), cat("a multiple of 8 elements (16 bytes), at least ", width),
                  t.stride[0]);
  require_aligned(t.data, name, 16);
}

// The cache fixes the KV heads and the device.
void check_cache(const TensorRef& kv) {
  using namespace detail;
  require_present(kv, "kv_cache");
  require_dtype(kv, "kv_cache", DType::kBFloat16);
  require_cuda(kv, "kv_cache");
  if (kv.ndim != 4 || kv.shape[0] < 1 || kv.shape[1] < 1 || kv.shape[2] != kPageSize ||
      kv.shape[3] != kCacheRowWidth)
    fail_expected("kv_cache", cat("[pages, KVH, ", kPageSize, ", ", kCacheRowWidth, "]"), kv.shape_str());
  require_kv_heads(kv.shape[1], "kv_cache KV heads");
  if (!kv.contiguous()) fail_expected("kv_cache", "contiguous", "a strided tensor");
  require_aligned(kv.data, "kv_cache", 16);
  if (kv.shape[0] > INT32_MAX) fail_expected("kv_cache pages", "at most 2^31 - 1", kv.shape[0]);
}

// A workspace given (needed or not): on the cache's device, contiguous,
// aligned; its size against need_bytes when the call needs one.
void check_workspace(const TensorRef& ws, int device, int64_t need_bytes, int reqs, int kvh, int splits) {
  using namespace detail;
  require_present(ws, "workspace");
  require_cuda(ws, "workspace");
  require_same_device(ws, "workspace", device);
  if (!ws.contiguous()) fail_expected("workspace", "contiguous", "a strided tensor");
  const int64_t have = ws.numel() * dtype_size(ws.dtype);
  if (have < need_bytes)
    fail_expected("workspace",
                  cat("at least ", need_bytes, " bytes (attn2_workspace_bytes(", reqs, ", ", kvh, ", ", splits, "))"),
                  cat(have, " bytes"));
  require_aligned(ws.data, "workspace", 16);
}

bool given(const TensorRef& t) { return t.present() && t.data != nullptr; }

}  // namespace

}  // namespace muse_decode

namespace muse_decode::attn2_impl {

void check_block_table(const TensorRef& bt, int reqs, int max_model_len, int device) {
  using namespace detail;
  require_present(bt, "block_table");
  require_dtype(bt, "block_table", DType::kInt32);
  require_cuda(bt, "block_table");
  require_same_device(bt, "block_table", device);
  const int64_t need_pages = (static_cast<int64_t>(max_model_len) + kPageSize - 1) / kPageSize;
  if (bt.ndim != 2 || bt.shape[0] != reqs || bt.shape[1] < need_pages)
    fail_expected("block_table", cat("[", reqs, ", >= ", need_pages, "] (R, ceil(max_model_len / 16))"),
                  bt.shape_str());
  if (bt.stride[1] != 1) fail_expected("block_table", "unit column stride", cat("stride ", bt.stride[1]));
  if (reqs > 1 && bt.stride[0] < bt.shape[1])
    fail_expected("block_table row stride", cat("at least ", bt.shape[1]), bt.stride[0]);
  require_aligned(bt.data, "block_table", 4);
}

Params params_of(const Attn2Args& a, const Attn2Residency& residency) {
  using namespace detail;
  check_deployment(a.max_model_len, a.window, a.num_splits);
  const TensorRef& kv = a.kv_cache;
  check_cache(kv);
  const int device = kv.device;
  const int kvh = static_cast<int>(kv.shape[1]);
  const int64_t width = static_cast<int64_t>(kvh) * kHeadsPerKvHead * kHeadDim;

  // Lengths fix the requests.
  const TensorRef& sl = a.seq_lens;
  require_present(sl, "seq_lens");
  require_dtype(sl, "seq_lens", DType::kInt32);
  require_cuda(sl, "seq_lens");
  require_same_device(sl, "seq_lens", device);
  if (sl.ndim != 1 || sl.shape[0] < 1 || sl.shape[0] > kMaxGridYZ)
    fail_expected("seq_lens", cat("[R] with 1 <= R <= ", kMaxGridYZ), sl.shape_str());
  if (!sl.contiguous()) fail_expected("seq_lens", "contiguous", cat("stride ", sl.stride[0]));
  require_aligned(sl.data, "seq_lens", 4);
  const int reqs = static_cast<int>(sl.shape[0]);
  const int64_t rows = static_cast<int64_t>(reqs) * kVerifyLen;

  const TensorRef& bt = a.block_table;
  check_block_table(bt, reqs, a.max_model_len, device);

  const std::pair<const TensorRef*, const char*> views[] = {{&a.q, "q"}, {&a.gate, "gate"}, {&a.out, "out"}};
  for (const auto& [t, name] : views) {
    require_rows(*t, name, rows, width);
    require_cuda(*t, name);
    require_same_device(*t, name, device);
  }

  const int64_t ws_need = attn2_workspace_bytes(reqs, kvh, a.num_splits);
  const TensorRef& ws = a.workspace;
  if (ws_need > 0 || given(ws)) check_workspace(ws, device, ws_need, reqs, kvh, a.num_splits);

  // out is written: it must not alias anything the kernel reads.
  const std::pair<const TensorRef*, const char*> inputs[] = {
      {&a.q, "q"}, {&a.gate, "gate"}, {&a.kv_cache, "kv_cache"}, {&a.block_table, "block_table"},
      {&a.seq_lens, "seq_lens"}};
  for (const auto& [t, name] : inputs) require_disjoint(a.out, "out", *t, name);
  if (ws_need > 0) {
    require_disjoint(a.out, "out", ws, "workspace");
    for (const auto& [t, name] : inputs) require_disjoint(ws, "workspace", *t, name);
  }

  Params p;
  p.q = a.q.data;
  p.q_stride = a.q.stride[0];
  p.gate = a.gate.data;
  p.gate_stride = a.gate.stride[0];
  p.kv_cache = kv.data;
  p.num_pages = static_cast<int>(kv.shape[0]);
  p.block_table = static_cast<const int32_t*>(bt.data);
  p.block_table_stride = bt.stride[0];
  p.seq_lens = static_cast<const int32_t*>(sl.data);
  p.out = a.out.data;
  p.out_stride = a.out.stride[0];
  p.workspace = ws_need > 0 ? ws.data : nullptr;
  p.num_reqs = reqs;
  p.num_kv_heads = kvh;
  p.max_model_len = a.max_model_len;
  p.window = a.window;
  p.num_splits = a.num_splits;
  // 8 where the GPU cannot place a cluster of 16 (or the environment caps it).
  const int cluster = a.num_splits == 1 ? 16 : split_cluster(kvh);
  p.cluster_size = cluster == 16 ? residency.short_cluster_size : cluster;
  p.pdl = a.pdl;
  if (p.num_splits > 1) {  // a split grid that fills the GPU exactly: its last cluster does less (see the kernel)
    const int64_t ctas = static_cast<int64_t>(p.num_reqs) * p.num_kv_heads * p.num_splits * p.cluster_size;
    const int64_t resident = resident_ctas(residency, p.cluster_size);
    p.idle_last = ctas == resident;
    p.resident = ctas <= resident;  // all of it on the GPU at once: the merging slice may wait for the others
  }
  return p;
}

}  // namespace muse_decode::attn2_impl

namespace muse_decode {

void check_attn2(const Attn2Args& args) { attn2_impl::params_of(args, kH200Attn2Residency); }

std::optional<std::string> unsupported_attn2_call(const Attn2Args& args) {
  return detail::reason_of([&] { check_attn2(args); });
}

// ---------------------------------------------------------------------------
// Prepared devices: what the launch is sized by (attn2_residency).
namespace {
detail::PerDevice<Attn2Residency> g_prepared;

// MUSE_DECODE_ATTN2_MAX_CLUSTER (8 or 16; 16 when unset): see prepare_attn2.
int max_cluster_from_env() {
  const char* v = std::getenv("MUSE_DECODE_ATTN2_MAX_CLUSTER");
  if (v == nullptr || *v == '\0') return 16;
  const std::string s(v);
  if (s == "8") return 8;
  if (s == "16") return 16;
  fail_expected("MUSE_DECODE_ATTN2_MAX_CLUSTER (environment)", "8 or 16", cat("'", s, "'"));
}
}  // namespace

void prepare_attn2(int device) {
  const int max_cluster = max_cluster_from_env();  // checked before the device
  detail::prepare_device(g_prepared, "attn2", device, [max_cluster](int) {
    Attn2Residency r;
    detail::throw_if_cuda_error(attn2_impl::set_kernel_attributes(&r.short_cluster_size),
                                "prepare_attn2: setting the kernel attributes");
    if (max_cluster == 8) r.short_cluster_size = 8;
    // Co-resident CTAs with clusters of 8 and of 16; 0 (never idle_last or
    // resident) where the runtime cannot say.
    int blocks_per_sm = 0, clusters = 0;
    if (attn2_impl::occupancy(8, &blocks_per_sm, &clusters) == detail::kCudaSuccess) r.resident_ctas_8 = 8 * clusters;
    if (attn2_impl::occupancy(16, &blocks_per_sm, &clusters) == detail::kCudaSuccess)
      r.resident_ctas_16 = 16 * clusters;
    return r;
  });
}

Attn2Residency attn2_residency(int device) {
  device = detail::resolve_device(device);
  if (const Attn2Residency* r = g_prepared.find(device)) return *r;
  fail(cat("attn2_residency(", device, ") needs prepare_attn2(", device, ") first"));
}

void attn2(const Attn2Args& args, Stream stream) {
  const Attn2Residency* r = g_prepared.find(args.kv_cache.device);
  if (r == nullptr) {  // the arguments' reason first, then the missing prepare
    check_attn2(args);
    detail::require_prepared(g_prepared, "attn2", args.kv_cache.device);
  }
  detail::throw_if_cuda_error(attn2_impl::launch(attn2_impl::params_of(args, *r), stream), "attn2: kernel launch");
}

// ---------------------------------------------------------------------------
// The bound form: what a call cannot change is checked here, once.
Attn2::Attn2(const TensorRef& kv_cache, const TensorRef& workspace, int max_model_len, int window, int num_splits)
    : kv_cache_(kv_cache), workspace_(workspace), max_model_len_(max_model_len), window_(window),
      num_splits_(num_splits) {
  check_deployment(max_model_len, window, num_splits);
  check_cache(kv_cache);
  // Its size depends on the requests of a call: checked then.
  if (num_splits > 1 || given(workspace)) check_workspace(workspace, kv_cache.device, 0, 0, 0, 0);
  prepare_attn2(kv_cache.device);
}

Attn2Args Attn2::args(const TensorRef& q, const TensorRef& gate, const TensorRef& block_table,
                      const TensorRef& seq_lens, const TensorRef& out, bool pdl) const {
  Attn2Args a;
  a.q = q;
  a.gate = gate;
  a.kv_cache = kv_cache_;
  a.block_table = block_table;
  a.seq_lens = seq_lens;
  a.out = out;
  a.workspace = workspace_;
  a.max_model_len = max_model_len_;
  a.window = window_;
  a.num_splits = num_splits_;
  a.pdl = pdl;
  return a;
}

void Attn2::operator()(const TensorRef& q, const TensorRef& gate, const TensorRef& block_table,
                       const TensorRef& seq_lens, const TensorRef& out, Stream stream, bool pdl) const {
  attn2(args(q, gate, block_table, seq_lens, out, pdl), stream);
}

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the kernels' entries
// with cudaErrorNotSupported.
namespace muse_decode::attn2_impl {
int launch(const Params&, Stream) { return detail::kCudaErrorNotSupported; }
int set_kernel_attributes(int*) { return detail::kCudaErrorNotSupported; }
int occupancy(int, int*, int*) { return detail::kCudaErrorNotSupported; }
}  // namespace muse_decode::attn2_impl
#endif
