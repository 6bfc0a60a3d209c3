// The verify step on the GPU: qkv_front, attn2, o_proj and route of one
// layer, over several layers' worth of random weights and caches, each op
// checked against the CPU reference on the first layer and timed (CUDA-graph
// replay, L2 flushed before each replay) beside the unfused path of the same
// inputs; then the attention block twice, as the three ops chained and as
// attention_block's one launch (checked against the chain's CPU reference),
// or, where attention_block does not serve the deployment, its reason.
// run_gpu is the sequence of steps below: the shape, the layers, each op's
// check, each op's timing, the block's, the floors.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device.h"
#include "graph_timing.h"
#include "muse_decode/arch.h"
#include "muse_decode/attention_block.h"
#include "muse_decode/attn2.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"
#include "step_checks.h"
#include "step_inputs.h"
#include "unfused.h"
#include "verify_step.h"

namespace muse_decode::tool {
namespace {

using support::cuda_ok;
using support::Device;

void note(const Deployment& d, const char* what) {
  if (d.progress) std::fprintf(stderr, "muse-decode: %s\n", what);
}

// The rows of run_gpu's results, in this order; then the block's: the three
// ops chained ("block"), and attention_block.
enum Row { kFront, kAttn, kOProj, kRoute };

// ---- the shape ---------------------------------------------------------------------
// The step's sizes at this deployment, and how many copies of each input the
// timing rotates through.
struct Shape {
  int kvh, heads, n;      // KV heads, query heads, qkv_front's output width
  int R, T, L;            // requests, tokens, keys per request (max_model_len)
  int pages_per_req, window, splits, local;
  int k_in;               // o_proj's input width
  bool rope;              // a sliding layer: RoPE and the window
  double weight_bytes, o_weight_bytes, cache_bytes;  // one layer's
  int layers;             // caches (and at least as many weight copies)
  int w_copies, wo_copies;
  int64_t block_ws_bytes; // attention_block's workspace; 0 where it does not serve the deployment
};

// attention_block's workspace at this deployment, or 0 where its sizing
// refuses it (the reason is then unsupported_attention_block_call's).
int64_t block_workspace_bytes(const Shape& s) {
  try {
    return attention_block_workspace_bytes(s.R, s.kvh, s.L, s.window);
  } catch (const std::invalid_argument&) {
    return 0;
  }
}

Shape shape_of(const Deployment& d) {
  Shape s;
  s.kvh = 16 / d.tp;
  s.heads = kHeadsPerKvHead * s.kvh;
  s.n = qkv_width(s.kvh);
  s.R = d.requests;
  s.T = kVerifyLen * s.R;
  s.L = d.context;
  s.pages_per_req = (s.L + kPageSize - 1) / kPageSize;
  s.window = attn2_window(d.sliding ? std::optional<int>(kSlidingWindow) : std::nullopt, s.L);
  s.splits = attn2_splits(s.L, s.window, s.kvh);
  s.local = kNumExperts / d.tp;
  s.k_in = s.heads * kHeadDim;
  s.rope = d.sliding;
  s.weight_bytes = double(s.n) * kHiddenSize * 2;
  s.o_weight_bytes = double(kHiddenSize) * s.k_in * 2;
  s.cache_bytes = double(s.R) * s.pages_per_req * s.kvh * kPageSize * 128 * 2;
  s.layers = d.layers ? d.layers
                      : std::clamp(int(std::ceil(3 * 60e6 / (s.weight_bytes + s.o_weight_bytes + s.cache_bytes))), 2, 16);
  // Each op alone rotates its own inputs past three times the L2: the front's
  // and o_proj's weights get copies of their own beyond the layers' (at 128k
  // two layers' caches are enough, but two o_proj weights, 34 MB, would sit
  // in the 60 MB L2). Call i reads weight copy i % w_copies, o_proj weight
  // i % wo_copies and cache i % layers.
  s.w_copies = std::max(s.layers, int(std::ceil(3 * 60e6 / s.weight_bytes)));
  s.wo_copies = std::max(s.layers, int(std::ceil(3 * 60e6 / s.o_weight_bytes)));
  s.block_ws_bytes = block_workspace_bytes(s);
  return s;
}

// ---- the layers ----------------------------------------------------------------------
// Every buffer of the attention ops on the device, and the host copies of
// what the checks read beside the downloads. The caches' pages are
// shuffled, and every request has L keys.
struct Layers {
  explicit Layers(const Shape& s)
      : x(size_t(s.T) * kHiddenSize),
        w(size_t(s.w_copies) * s.n * kHiddenSize),
        out(size_t(s.T) * s.n),
        attn(size_t(s.T) * s.heads * kHeadDim),
        cache(size_t(s.layers) * s.R * s.pages_per_req * s.kvh * kPageSize * 128),
        wo(size_t(s.wo_copies) * kHiddenSize * s.k_in),
        hidden(size_t(s.T) * kHiddenSize),
        cos_sin(size_t(s.L) * 64),
        scratch(size_t(s.T) * s.heads * kHeadDim),
        positions(s.T),
        slots(s.T),
        table(size_t(s.R) * s.pages_per_req),
        lens(s.R),
        layer_cache(cache.n / s.layers),
        front_ws_bytes(size_t(qkv_front_workspace_bytes_for_device(s.kvh))),
        attn_ws_bytes(size_t(std::max<int64_t>(attn2_workspace_bytes(s.R, s.kvh, s.splits), 16))),
        front_ws(front_ws_bytes),
        attn_ws(attn_ws_bytes),
        block_out(size_t(s.T) * kHiddenSize),
        block_ws_bytes(size_t(std::max<int64_t>(s.block_ws_bytes, 16))),
        block_ws(block_ws_bytes) {}

  Device<uint16_t> x, w, out, attn, cache, wo, hidden;
  Device<float> cos_sin, scratch;  // scratch: the unfused attention's fp32 rows
  Device<int64_t> positions, slots;
  Device<int32_t> table, lens;
  size_t layer_cache;  // elements of one layer's cache
  size_t front_ws_bytes, attn_ws_bytes;
  Device<uint8_t> front_ws, attn_ws;
  Device<uint16_t> block_out;  // attention_block's out [T, 8192]
  size_t block_ws_bytes;
  Device<uint8_t> block_ws;
  std::vector<float> h_cos_sin;
  std::vector<int32_t> h_table, h_lens;
  std::vector<int64_t> h_pos, h_slots;
};

// Random weights and caches, the RoPE table, the block table and the step's
// positions and slots, all uploaded; the workspaces zeroed.
void fill_layers(Layers& b, const Shape& s, std::mt19937& rng) {
  using support::random_bf16;
  b.x.upload(random_bf16(b.x.n, support::kActivationScale, rng));
  for (int c = 0; c < s.w_copies; ++c)
    b.w.upload(random_bf16(size_t(s.n) * kHiddenSize, support::kQkvWeightScale, rng), size_t(c) * s.n * kHiddenSize);
  for (int l = 0; l < s.layers; ++l)
    b.cache.upload(random_bf16(b.layer_cache, support::kActivationScale, rng), b.layer_cache * l);
  for (int c = 0; c < s.wo_copies; ++c)
    b.wo.upload(random_bf16(size_t(kHiddenSize) * s.k_in, support::kOProjWeightScale, rng),
                size_t(c) * kHiddenSize * s.k_in);
  b.h_cos_sin = support::rope_table(s.L);
  b.cos_sin.upload(b.h_cos_sin);
  b.h_table.resize(size_t(s.R) * s.pages_per_req);  // request r's pages: h_table[r * pages_per_req ...]
  for (size_t i = 0; i < b.h_table.size(); ++i) b.h_table[i] = int32_t(i);
  std::shuffle(b.h_table.begin(), b.h_table.end(), rng);
  b.h_lens.assign(s.R, s.L);
  b.h_pos.resize(s.T);
  b.h_slots.resize(s.T);
  for (int r = 0; r < s.R; ++r)
    support::step_positions(s.L, &b.h_table[size_t(r) * s.pages_per_req], &b.h_pos[r * kVerifyLen],
                            &b.h_slots[r * kVerifyLen]);
  b.table.upload(b.h_table);
  b.lens.upload(b.h_lens);
  b.positions.upload(b.h_pos);
  b.slots.upload(b.h_slots);
  cuda_ok(cudaMemset(b.front_ws.ptr, 0, b.front_ws_bytes), "memset");
  cuda_ok(cudaMemset(b.attn_ws.ptr, 0, b.attn_ws_bytes), "memset");
  cuda_ok(cudaMemset(b.block_ws.ptr, 0, b.block_ws_bytes), "memset");
  cuda_ok(cudaDeviceSynchronize(), "memset");  // the legacy stream's memsets before the tool's stream
}

// ---- the ops ---------------------------------------------------------------------------
// The fused attention ops of call l, on layer l's weight copies and cache.
struct FusedOps {
  const Shape& s;
  const Layers& b;
  cudaStream_t stream;

  void front(int l, bool pdl = true) const {  // qkv_front over all T tokens, 16 at a time
    for (int t0 = 0; t0 < s.T; t0 += kFrontMaxTokens) {
      const int tn = std::min(kFrontMaxTokens, s.T - t0);
      QkvFrontArgs a;
      a.x = make_tensor(b.x.ptr + size_t(t0) * kHiddenSize, DType::kBFloat16, {tn, kHiddenSize});
      a.weight = qkv_weight(l);
      a.positions = make_tensor(b.positions.ptr + t0, DType::kInt64, {tn});
      if (s.rope) a.cos_sin = make_tensor(b.cos_sin.ptr, DType::kFloat32, {s.L, 64});
      a.slot_mapping = make_tensor(b.slots.ptr + t0, DType::kInt64, {tn});
      a.kv_cache = layer_cache(l);
      a.num_kv_heads = s.kvh;
      a.out = make_tensor(b.out.ptr + size_t(t0) * s.n, DType::kBFloat16, {tn, s.n});
      a.workspace = make_tensor(b.front_ws.ptr, DType::kUInt8, {int64_t(b.front_ws_bytes)});
      a.pdl = pdl;
      qkv_front(a, reinterpret_cast<Stream>(stream));
    }
  }
  void attn(int l, bool pdl = true) const {
    Attn2Args a;
    TensorRef q = make_tensor(b.out.ptr, DType::kBFloat16, {s.T, s.heads * kHeadDim});
    q.stride[0] = s.n;
    TensorRef gate = q;
    gate.data = b.out.ptr + size_t(s.heads + 2 * s.kvh) * kHeadDim;
    a.q = q;
    a.gate = gate;
    a.kv_cache = layer_cache(l);
    a.block_table = make_tensor(b.table.ptr, DType::kInt32, {s.R, s.pages_per_req});
    a.seq_lens = make_tensor(b.lens.ptr, DType::kInt32, {s.R});
    a.out = make_tensor(b.attn.ptr, DType::kBFloat16, {s.T, s.heads * kHeadDim});
    if (s.splits > 1) a.workspace = make_tensor(b.attn_ws.ptr, DType::kUInt8, {int64_t(b.attn_ws_bytes)});
    a.max_model_len = s.L;
    a.window = s.window;
    a.num_splits = s.splits;
    a.pdl = pdl;
    attn2(a, reinterpret_cast<Stream>(stream));
  }
  void o_proj(int l, bool pdl = true) const {  // attn2's rows through this layer's output projection
    OProjArgs a;
    a.x = make_tensor(b.attn.ptr, DType::kBFloat16, {s.T, s.k_in});
    a.weight = o_weight(l);
    a.out = make_tensor(b.hidden.ptr, DType::kBFloat16, {s.T, kHiddenSize});
    a.pdl = pdl;
    muse_decode::o_proj(a, reinterpret_cast<Stream>(stream));
  }
  // attention_block of call l: qkv_front, attn2 and o_proj of call l in one launch.
  void block(int l) const { attention_block(block_args(l), reinterpret_cast<Stream>(stream)); }
  AttentionBlockArgs block_args(int l) const {
    AttentionBlockArgs a;
    a.x = make_tensor(b.x.ptr, DType::kBFloat16, {s.T, kHiddenSize});
    a.qkv_weight = qkv_weight(l);
    a.positions = make_tensor(b.positions.ptr, DType::kInt64, {s.T});
    if (s.rope) a.cos_sin = make_tensor(b.cos_sin.ptr, DType::kFloat32, {s.L, 64});
    a.slot_mapping = make_tensor(b.slots.ptr, DType::kInt64, {s.T});
    a.kv_cache = layer_cache(l);
    a.num_kv_heads = s.kvh;
    a.block_table = make_tensor(b.table.ptr, DType::kInt32, {s.R, s.pages_per_req});
    a.seq_lens = make_tensor(b.lens.ptr, DType::kInt32, {s.R});
    a.max_model_len = s.L;
    a.window = s.window;
    a.o_proj_weight = o_weight(l);
    a.out = make_tensor(b.block_out.ptr, DType::kBFloat16, {s.T, kHiddenSize});
    a.workspace = make_tensor(b.block_ws.ptr, DType::kUInt8, {int64_t(b.block_ws_bytes)});
    return a;
  }
  // The layer as an engine binds it: the three ops' descriptions.
  AttentionBlockLayer block_layer(const Deployment& d) const {
    AttentionBlockLayer layer;
    layer.projection.tp_size = d.tp;
    layer.projection.weight = qkv_weight(0);
    layer.projection.num_heads = s.heads;
    layer.projection.num_kv_heads = s.kvh;
    layer.projection.use_rope = layer.projection.rotary.present = s.rope;
    if (s.rope) layer.projection.rotary.cos_sin = make_tensor(b.cos_sin.ptr, DType::kFloat32, {s.L, 64});
    layer.attention.num_heads = s.heads;
    layer.attention.num_kv_heads = s.kvh;
    layer.output.tp_size = d.tp;
    layer.output.num_heads = s.heads;
    layer.output.weight = o_weight(0);
    layer.num_kv_heads = s.kvh;
    layer.max_model_len = s.L;
    layer.max_reqs = s.R;
    if (s.rope) layer.sliding_window = kSlidingWindow;
    return layer;
  }
  TensorRef qkv_weight(int l) const {
    return make_tensor(b.w.ptr + size_t(l % s.w_copies) * s.n * kHiddenSize, DType::kBFloat16, {s.n, kHiddenSize});
  }
  TensorRef o_weight(int l) const {
    return make_tensor(b.wo.ptr + size_t(l % s.wo_copies) * kHiddenSize * s.k_in, DType::kBFloat16,
                       {kHiddenSize, s.k_in});
  }
  TensorRef layer_cache(int l) const {
    return make_tensor(b.cache.ptr + b.layer_cache * (l % s.layers), DType::kBFloat16,
                       {int64_t(s.R) * s.pages_per_req, s.kvh, kPageSize, 128});
  }
};

// route's inputs and outputs for kCalls calls of 8 tokens (every request's
// tokens), and the bound op.
struct RouteCalls {
  static constexpr int kCalls = 256;
  static RouterDesc router_of(float* bias) {
    RouterDesc router;
    router.expert_bias = make_tensor(bias, DType::kFloat32, {kNumExperts});
    return router;
  }
  RouteCalls(const Deployment& d, const Shape& s, std::mt19937& rng, cudaStream_t stream_)
      : logits(support::random_f32(size_t(kCalls) * 8 * kNumExperts, support::kLogitScale, rng)),
        bias(support::random_f32(kNumExperts, support::kBiasScale, rng)),
        md_len((metadata_size(d.tile_n) + 3) / 4 * 4),
        local(s.local),
        tile_n(d.tile_n),
        stream(stream_),
        d_logits(logits.size()),
        d_bias(kNumExperts),
        d_weights(size_t(kCalls) * 64),
        d_ids(size_t(kCalls) * 64),
        d_md(size_t(kCalls) * md_len),
        routing(router_of(d_bias.ptr)) {
    d_logits.upload(logits);
    d_bias.upload(bias);
    cuda_ok(cudaMemset(d_md.ptr, 0xff, d_md.n * 4), "memset");
    cuda_ok(cudaDeviceSynchronize(), "memset");
  }
  void operator()(int i) const {
    RoutingMetadata m{make_tensor(d_md.ptr + i * md_len, DType::kInt32, {md_len}), 0, local, tile_n};
    routing(make_tensor(d_logits.ptr + size_t(i) * 8 * kNumExperts, DType::kFloat32, {8, kNumExperts}),
            make_tensor(d_ids.ptr + i * 64, DType::kInt32, {8, 8}),
            make_tensor(d_weights.ptr + i * 64, DType::kFloat32, {8, 8}), m, reinterpret_cast<Stream>(stream));
  }

  std::vector<float> logits, bias;
  int64_t md_len;  // a call's metadata, rounded up to 16 bytes
  int local, tile_n;
  cudaStream_t stream;
  Device<float> d_logits, d_bias, d_weights;
  Device<int32_t> d_ids, d_md;
  MuseRouting routing;
};

// The unfused path of call i (cuBLAS + plain kernels), reading what the
// fused call i reads.
class UnfusedOps {
 public:
  UnfusedOps(const Shape& s, const Layers& b, const RouteCalls& route, cudaStream_t stream)
      : s_(s), b_(b), route_(route), stream_(stream) {
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  }
  ~UnfusedOps() { cublasDestroy(cublas_); }
  UnfusedOps(const UnfusedOps&) = delete;
  UnfusedOps& operator=(const UnfusedOps&) = delete;

  void front(int i) const {
    unfused_front(UnfusedFrontArgs{b_.x.ptr, b_.w.ptr + size_t(i % s_.w_copies) * s_.n * kHiddenSize,
                                   b_.positions.ptr, s_.rope ? b_.cos_sin.ptr : nullptr, b_.slots.ptr,
                                   b_.cache.ptr + b_.layer_cache * (i % s_.layers), b_.out.ptr, s_.T, s_.kvh},
                  cublas_, stream_);
  }
  void attn(int i) const {
    unfused_attention(UnfusedAttentionArgs{b_.out.ptr, b_.out.ptr + size_t(s_.heads + 2 * s_.kvh) * kHeadDim, s_.n,
                                           s_.n, b_.cache.ptr + b_.layer_cache * (i % s_.layers), b_.table.ptr,
                                           s_.pages_per_req, b_.lens.ptr, b_.scratch.ptr, b_.attn.ptr, s_.R, s_.kvh,
                                           s_.window},
                      stream_);
  }
  void o_proj(int i) const {
    unfused_o_proj(UnfusedOProjArgs{b_.attn.ptr, b_.wo.ptr + size_t(i % s_.wo_copies) * kHiddenSize * s_.k_in,
                                    b_.hidden.ptr, s_.T, s_.k_in},
                   cublas_, stream_);
  }
  void route(int i) const {
    unfused_route(UnfusedRouteArgs{route_.d_logits.ptr + size_t(i) * 8 * kNumExperts, route_.d_bias.ptr,
                                   route_.d_ids.ptr + i * 64, route_.d_weights.ptr + i * 64,
                                   route_.d_md.ptr + i * route_.md_len, 8, 0, route_.local, route_.tile_n},
                  stream_);
  }

 private:
  const Shape& s_;
  const Layers& b_;
  const RouteCalls& route_;
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
};

// ---- the checks: layer 0 of each op against the CPU reference ---------------------------
OpResult result(const char* op, bool pass, const std::string& detail, double bytes) {
  OpResult r;
  r.op = op;
  r.pass = pass;
  r.detail = detail;
  r.bytes = bytes;
  return r;
}

OpResult check_qkv_front(const Deployment& d, const Shape& s, const Layers& b, const FusedOps& fused) {
  fused.front(0);
  cuda_ok(cudaStreamSynchronize(fused.stream), "qkv_front");
  note(d, "checking qkv_front against the CPU reference");
  const auto hx = b.x.download(b.x.n);
  const auto hw = b.w.download(size_t(s.n) * kHiddenSize);
  const auto hout = b.out.download(b.out.n);
  const int check_tokens = std::min(s.T, 8);
  const double err = support::qkv_front_error(hx.data(), check_tokens, hw.data(), s.kvh, b.h_pos.data(),
                                              s.rope ? b.h_cos_sin.data() : nullptr, s.L, hout.data());
  // Cache rows: the bits of out's k and v.
  const auto hcache = b.cache.download(b.layer_cache);
  const int cache_bad = support::cache_values_off(hcache.data(), hout.data(), b.h_slots.data(), check_tokens, s.kvh);
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d tokens: worst relative RMS per head %.2e (bar 5e-3), %d cache values differ from out",
                check_tokens, err, cache_bad);
  return result("qkv_front", err <= 5e-3 && cache_bad == 0, buf,
                s.weight_bytes + s.T * (kHiddenSize + s.n) * 2.0 + s.T * s.kvh * 256.0);
}

// Requests 0 and R-1, KV heads 0 and KVH-1.
OpResult check_attn2(const Deployment& d, const Shape& s, const Layers& b, const FusedOps& fused) {
  fused.attn(0);
  cuda_ok(cudaStreamSynchronize(fused.stream), "attn2");
  note(d, "checking attn2 against the CPU reference");
  const auto hout = b.out.download(b.out.n);
  const auto hattn = b.attn.download(b.attn.n);
  const auto hcache = b.cache.download(b.layer_cache);
  const reference::Attn2Inputs in = support::attn2_inputs(hout.data(), s.kvh, hcache.data(), b.h_table.data(),
                                                          s.pages_per_req, b.h_lens.data(), s.window);
  double worst = 0;
  for (int r : {0, s.R - 1})
    for (int kv : {0, s.kvh - 1}) worst = std::max(worst, support::attn2_error(in, r, kv, hattn.data()));
  char buf[200];
  std::snprintf(buf, sizeof buf, "requests {0, %d} x KV heads {0, %d}: worst relative RMS per row and head %.2e (bar 5e-3)",
                s.R - 1, s.kvh - 1, worst);
  const double keys = s.window ? std::min<double>(s.L, s.window + kVerifyLen - 1) : s.L;
  return result("attn2", worst <= 5e-3, buf, s.R * keys * s.kvh * 256.0 + 3.0 * s.T * s.heads * kHeadDim * 2);
}

// Layer 0's projection of attn2's rows, against the fp64 sums.
OpResult check_o_proj(const Deployment& d, const Shape& s, const Layers& b, const FusedOps& fused) {
  fused.o_proj(0);
  cuda_ok(cudaStreamSynchronize(fused.stream), "o_proj");
  note(d, "checking o_proj against the CPU reference");
  const auto hattn = b.attn.download(b.attn.n);
  const auto hwo = b.wo.download(size_t(kHiddenSize) * s.k_in);
  const auto hhidden = b.hidden.download(b.hidden.n);
  const double worst = support::o_proj_error(hattn.data(), s.T, s.k_in, hwo.data(), hhidden.data());
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d rows: worst relative RMS per row %.2e (bar 5e-3)", s.T, worst);
  return result("o_proj", worst <= 5e-3, buf, s.o_weight_bytes + s.T * (s.k_in + kHiddenSize) * 2.0);
}

// attention_block on layer 0 against its CPU reference (the three ops'
// references chained) for requests 0 and R-1, every KV head (o_proj's rows
// mix all of them), or why it does not serve this deployment (the layer's
// reason first, then the call's).
OpResult check_attention_block(const Deployment& d, const Shape& s, const Layers& b, const FusedOps& fused) {
  OpResult r = result("attention_block", false, "", 0);
  std::optional<std::string> why = unsupported_attention_block(fused.block_layer(d));
  if (!why) why = unsupported_attention_block_call(fused.block_args(0));
  if (why) {
    r.pass = true;  // nothing ran, nothing failed: the caller keeps the three ops
    r.skipped = *why;
    r.detail = "not run: the step keeps the three ops (the block row)";
    return r;
  }
  try {
    prepare_attention_block();
  } catch (const std::exception& e) {  // a failure: the checks said it serves
    r.skipped = std::string("prepare_attention_block refused a deployment the checks accept: ") + e.what();
    r.detail = "not run";
    return r;
  }
  fused.block(0);
  cuda_ok(cudaStreamSynchronize(fused.stream), "attention_block");
  note(d, "checking attention_block against the CPU reference");
  const auto hx = b.x.download(b.x.n);
  const auto hw = b.w.download(size_t(s.n) * kHiddenSize);
  const auto hwo = b.wo.download(size_t(kHiddenSize) * s.k_in);
  const auto hcache = b.cache.download(b.layer_cache);
  const auto hout = b.block_out.download(b.block_out.n);
  reference::AttentionBlockInputs in;
  in.x = hx.data();
  in.num_reqs = s.R;
  in.qkv_weight = hw.data();
  in.num_kv_heads = s.kvh;
  in.positions = b.h_pos.data();
  in.cos_sin = s.rope ? b.h_cos_sin.data() : nullptr;
  in.max_pos = s.L;
  in.slot_mapping = b.h_slots.data();
  in.num_pages = int64_t(s.R) * s.pages_per_req;
  in.block_table = b.h_table.data();
  in.block_table_stride = s.pages_per_req;
  in.seq_lens = b.h_lens.data();
  in.window = s.window;
  in.o_proj_weight = hwo.data();
  std::vector<int> reqs{0};
  if (s.R > 1) reqs.push_back(s.R - 1);
  const support::BlockError err = support::attention_block_error(in, reqs, hout.data(), kHiddenSize, hcache.data());
  const long not_finite = std::count_if(hout.begin(), hout.end(), [](uint16_t v) {
    return !std::isfinite(reference::bf16_bits_to_float(v));
  });
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "one cooperative launch; requests {0, %d} x every KV head against the fp64 reference of the chain: "
                "worst relative RMS per row of out %.2e, per head of the inserted cache rows %.2e (bar 5e-3); %ld "
                "values of out not finite",
                s.R - 1, err.out, err.cache, not_finite);
  r.pass = err.out <= 5e-3 && err.cache <= 5e-3 && not_finite == 0;
  r.detail = buf;
  return r;
}

// Every call of 8 tokens: ids, weights and metadata.
OpResult check_route(const Deployment& d, const RouteCalls& route) {
  for (int i = 0; i < RouteCalls::kCalls; ++i) route(i);
  cuda_ok(cudaStreamSynchronize(route.stream), "route");
  note(d, "checking route against the CPU reference");
  const auto ids = route.d_ids.download(route.d_ids.n);
  const auto wts = route.d_weights.download(route.d_weights.n);
  const auto meta = route.d_md.download(route.d_md.n);
  int id_diff = 0, w_bad = 0, md_bad = 0;
  for (int i = 0; i < RouteCalls::kCalls; ++i) {
    const support::RouteDiff diff =
        support::route_diff(&route.logits[size_t(i) * 8 * kNumExperts], 8, route.bias.data(), &ids[i * 64],
                            &wts[i * 64], &meta[i * route.md_len], 0, route.local, route.tile_n);
    id_diff += diff.ids_differ;
    w_bad += diff.weights_off;
    md_bad += diff.metadata_differs;
  }
  char buf[220];
  std::snprintf(buf, sizeof buf, "%d rows: %d ids differ from the host-expf reference (near-ties), %d weights off, %d metadata buffers differ",
                RouteCalls::kCalls * 8, id_diff, w_bad, md_bad);
  // The host expf may differ from CUDA's in the last bit: ids may differ only at near-ties.
  return result("route", w_bad == 0 && md_bad == 0 && id_diff <= RouteCalls::kCalls * 64 / 1000, buf,
                8 * kNumExperts * 4.0 + kNumExperts * 4.0 + 64 * 8.0);
}

// ---- the timing: fused and unfused, by graph replay with the L2 flushed ------------------
class Timer {
 public:
  Timer(cudaStream_t stream, int replays) : stream_(stream), replays_(replays), scrub_(size_t(256) << 20) {}
  // The median time per call of a graph of call(0) .. call(calls - 1).
  template <typename Call>
  double us(int calls, Call&& call) const {
    const auto flush = [&](cudaStream_t s) { cuda_ok(cudaMemsetAsync(scrub_.ptr, 1, scrub_.n, s), "flush"); };
    return support::time_calls(stream_, calls, replays_, call, flush).median_us;
  }

 private:
  cudaStream_t stream_;
  int replays_;
  Device<char> scrub_;  // 256 MB written before each replay: nothing of the last one stays in the 60 MB L2
};

// A build with -DMUSE_DECODE_TRACE=ON defines the dumps of the kernels'
// phase stamps (src/common/trace.cuh). With MUSE_DECODE_TRACE_DIR set, the
// tool writes attn2's ring after timing attn2 alone
// (trace_attn2_<tp>_<context>_<layer>.bin) and all three rings after timing
// the block (trace_block_<op>_<tp>_<context>_<layer>.bin), for bench/trace.py.
extern "C" int muse_decode_dump_attn2_trace(const char* path) __attribute__((weak));
extern "C" int muse_decode_dump_qkv_front_trace(const char* path) __attribute__((weak));
extern "C" int muse_decode_dump_o_proj_trace(const char* path) __attribute__((weak));
extern "C" int muse_decode_dump_attention_block_trace(const char* path) __attribute__((weak));

void dump_trace(int (*dump)(const char*), const std::string& what, const Deployment& d) {
  const char* dir = std::getenv("MUSE_DECODE_TRACE_DIR");
  if (!dump || !dir) return;
  const std::string path = std::string(dir) + "/trace_" + what + "_tp" + std::to_string(d.tp) + "_" +
                           std::to_string(d.context) + "_" + (d.sliding ? "sliding" : "full") + ".bin";
  if (dump(path.c_str()) != 0) std::fprintf(stderr, "could not write %s\n", path.c_str());
}
// The three rings of the block's kernels as trace_<run>_<op>_....
void dump_block_traces(const std::string& run, const Deployment& d) {
  dump_trace(muse_decode_dump_qkv_front_trace, run + "_qkv_front", d);
  dump_trace(muse_decode_dump_attn2_trace, run + "_attn2", d);
  dump_trace(muse_decode_dump_o_proj_trace, run + "_o_proj", d);
}

// Calls per graph of qkv_front, attn2, o_proj and the block: as many as the
// benchmarks replay, and every layer.
int op_calls(const Deployment& d, const Shape& s) { return d.calls ? d.calls : std::max(s.layers, 40); }

// Each op alone, fused and unfused, into its row's times. The unfused
// attention is slow (a block per row and head), so it takes 8 calls.
void time_ops(const Deployment& d, const Shape& s, const FusedOps& fused, const RouteCalls& route,
              const UnfusedOps& unfused, const Timer& timer, std::vector<OpResult>& results) {
  const int calls = op_calls(d, s);
  note(d, "timing qkv_front (fused and unfused)");
  results[kFront].us = timer.us(calls, [&](int i) { fused.front(i); });
  results[kFront].unfused_us = timer.us(calls, [&](int i) { unfused.front(i); });
  note(d, "timing attn2 (fused and unfused)");
  results[kAttn].us = timer.us(calls, [&](int i) { fused.attn(i); });
  dump_trace(muse_decode_dump_attn2_trace, "attn2", d);
  results[kAttn].unfused_us = timer.us(std::min(calls, 8), [&](int i) { unfused.attn(i); });
  note(d, "timing route (fused and unfused)");
  results[kRoute].us = timer.us(RouteCalls::kCalls, route);
  results[kRoute].unfused_us = timer.us(64, [&](int i) { unfused.route(i); });
  note(d, "timing o_proj (fused and cuBLAS)");
  results[kOProj].us = timer.us(calls, [&](int i) { fused.o_proj(i); });
  results[kOProj].unfused_us = timer.us(calls, [&](int i) { unfused.o_proj(i); });
}

// The attention block: qkv_front, attn2 and o_proj back to back on one
// stream, each kernel launched with PDL behind the one before, every
// iteration on another layer's weights and cache.
OpResult time_block(const Deployment& d, const Shape& s, const FusedOps& fused, const UnfusedOps& unfused,
                    const Timer& timer, const std::vector<OpResult>& results) {
  note(d, "timing the attention block (chained and unfused)");
  const int calls = op_calls(d, s);
  OpResult b;
  b.op = "block";
  b.pass = results[kFront].pass && results[kAttn].pass && results[kOProj].pass;
  // Where the chain's time goes: each junction alone (two ops chained), and
  // the block with every launch plain (no programmatic dependent launch).
  const double front_attn = timer.us(calls, [&](int i) {
    fused.front(i);
    fused.attn(i);
  });
  const double attn_oproj = timer.us(calls, [&](int i) {
    fused.attn(i);
    fused.o_proj(i);
  });
  const double plain = timer.us(calls, [&](int i) {
    fused.front(i, false);
    fused.attn(i, false);
    fused.o_proj(i, false);
  });
  // What the block must read: the front's and o_proj's weights and attn2's keys and values; the
  // tokens' rows in and out (x, qkv, attention, o_proj's output, the cache rows written).
  b.bytes = results[kFront].bytes + results[kAttn].bytes + results[kOProj].bytes;
  b.us = timer.us(calls, [&](int i) {
    fused.front(i);
    fused.attn(i);
    fused.o_proj(i);
  });
  dump_block_traces("block", d);
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "qkv_front, attn2 and o_proj chained in one graph (checked op by op above); chained pairs: "
                "qkv_front + attn2 %.2f us, attn2 + o_proj %.2f us; the block without PDL %.2f us",
                front_attn, attn_oproj, plain);
  b.detail = buf;
  b.unfused_us = timer.us(std::min(calls, 8), [&](int i) {
    unfused.front(i);
    unfused.attn(i);
    unfused.o_proj(i);
  });
  return b;
}

// attention_block: the chained block's step (the same bytes, the same
// rotation through the layers) in one cooperative launch per layer; its
// anchor the chain's unfused path. A row that did not run stays as it is.
void time_attention_block(const Deployment& d, const Shape& s, const FusedOps& fused, const Timer& timer,
                          const std::vector<OpResult>& results, const OpResult& chain, OpResult& r) {
  if (!r.skipped.empty()) return;
  note(d, "timing attention_block");
  r.us = timer.us(op_calls(d, s), [&](int i) { fused.block(i); });
  dump_trace(muse_decode_dump_attention_block_trace, "attention_block", d);
  r.bytes = chain.bytes;
  r.unfused_us = chain.unfused_us;
  const double alone = results[kFront].us + results[kAttn].us + results[kOProj].us;
  char buf[160];
  std::snprintf(buf, sizeof buf, "; %.2f us against the chain's %.2f (%.2fx) and the ops alone, added, %.2f", r.us,
                chain.us, chain.us / r.us, alone);
  r.detail += buf;
}

}  // namespace

std::vector<OpResult> run_gpu(const Deployment& d) {
  const Shape s = shape_of(d);
  std::mt19937 rng(2026);
  const support::NonBlockingStream stream;
  prepare_attn2();
  prepare_qkv_front();
  prepare_route();
  prepare_o_proj();

  note(d, "allocating random weights and caches");
  Layers layers(s);
  fill_layers(layers, s, rng);
  const FusedOps fused{s, layers, stream};
  std::vector<OpResult> results;
  results.push_back(check_qkv_front(d, s, layers, fused));
  results.push_back(check_attn2(d, s, layers, fused));
  results.push_back(check_o_proj(d, s, layers, fused));
  const RouteCalls route(d, s, rng, stream);
  results.push_back(check_route(d, route));
  OpResult block = check_attention_block(d, s, layers, fused);

  const Timer timer(stream, d.replays);
  const UnfusedOps unfused(s, layers, route, stream);
  time_ops(d, s, fused, route, unfused, timer, results);
  results.push_back(time_block(d, s, fused, unfused, timer, results));
  time_attention_block(d, s, fused, timer, results, results.back(), block);
  results.push_back(block);
  for (auto& r : results) r.floor_us = r.bytes / support::kCopyBandwidth * 1e6;
  return results;
}

}  // namespace muse_decode::tool
