// engine_step: one Muse Spark layer's verify step as a C++ engine runs it (the
// C++ counterpart of python/muse_decode/layer.py), on random weights. How to
// build it against an installed package: CMakeLists.txt beside this file.
//
// Host part, on any machine: the layer's "why not" checks and the step's
// sizing on the deployment's shapes, one call checked and one refused, and a
// CPU reference on a small shape. GPU part (SM90 or SM100): the step's buffers
// allocated once, the ops bound to the layer, the layer's attention and
// route captured in one CUDA graph, then replayed for --steps steps with new
// positions, lengths and block tables written into device memory between
// replays, each replay checked against the CPU references. The attention is
// attention_block (qkv_front, attn2 and o_proj in one launch) where it serves
// the layer and the call, else the three ops chained (qkv_front -> attn2 ->
// o_proj), as an engine falls back; the example says which it took.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef MUSE_DECODE_WITH_CUDA  // defined by the package when the library has its kernels
#include <cuda_runtime.h>

#include "device.h"
#endif

#include "muse_decode/arch.h"
#include "muse_decode/attention_block.h"
#include "muse_decode/attn2.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"
#include "step_checks.h"  // support/: what this example shares with the muse-decode tool
#include "step_inputs.h"

namespace md = muse_decode;
namespace ref = muse_decode::reference;
namespace support = muse_decode::support;
using md::DType;
using md::TensorRef;

namespace {

constexpr int kTokens = md::kVerifyLen;  // one request: 1 token + 7 drafts per step
constexpr int kH200Sms = 132;            // sizes the front's workspace where no GPU can be asked

// One rank of a TP group serving one layer.
struct Deployment {
  int tp = 8;           // this rank has 16/tp KV heads and 256/tp experts (rank 0's here)
  int context = 4096;   // max_model_len: sizes the grid; the last step's length reaches it
  int steps = 4;        // graph replays
  bool sliding = true;  // a sliding-window RoPE layer (layer % 4 != 1), else full attention
  int tile_n = 128;     // the routed GEMMs' tile, for the routing metadata
  bool block = true;    // take attention_block where it serves (--no-block: the three ops always)

  int kvh() const { return md::kNumKvHeads / tp; }
  int heads() const { return md::kHeadsPerKvHead * kvh(); }
  int n() const { return md::qkv_width(kvh()); }           // the front's rows [q | k | v | gate]
  int k_in() const { return md::o_proj_in_width(kvh()); }  // attn2's rows, o_proj's input
  int experts() const { return md::kNumExperts / tp; }
  int table_width() const { return (context + md::kPageSize - 1) / md::kPageSize; }
  // Twice the pages one request needs, so that every step can take other ones.
  int pool_pages() const { return 2 * table_width(); }
  int window() const {
    return md::attn2_window(sliding ? std::optional<int>(md::kSlidingWindow) : std::nullopt, context);
  }
  int splits() const { return md::attn2_splits(context, window(), kvh()); }
  // attention_block's workspace, or 16 bytes where its sizing refuses the
  // deployment (the step then keeps the three ops, and says why).
  int64_t block_workspace_bytes() const {
    try {
      return md::attention_block_workspace_bytes(1, kvh(), context, window());
    } catch (const std::invalid_argument&) {
      return 16;
    }
  }
};

// Every tensor of the step as a view into one device allocation, made once
// (256-byte aligned offsets). The checks and the sizing read views only, never
// the memory behind them, so the host part lays them out at a placeholder.
struct Step {
  TensorRef x, w_qkv, cos_sin, cache, positions, slots, qkv, front_ws;  // qkv_front
  TensorRef table, lens, attn, attn_ws;                                 // attn2 (q, gate: columns of qkv)
  TensorRef w_o, hidden;                                                // o_proj
  TensorRef block_ws;                                                   // attention_block (the rest: the above)
  TensorRef logits, bias, ids, weights, meta;                           // route
  size_t bytes = 0;
};
char* const kPlaceholder = reinterpret_cast<char*>(uintptr_t{1} << 40);

Step lay_out(const Deployment& d, char* base, int device, int sms) {
  Step s;
  auto take = [&](DType dtype, std::initializer_list<int64_t> shape) {
    TensorRef v = md::make_tensor(base + s.bytes, dtype, shape, device);
    s.bytes += (v.span_bytes() + 255) / 256 * 256;
    return v;
  };
  s.x = take(DType::kBFloat16, {kTokens, md::kHiddenSize});
  s.w_qkv = take(DType::kBFloat16, {d.n(), md::kHiddenSize});
  if (d.sliding) s.cos_sin = take(DType::kFloat32, {d.context, md::kHeadDim});  // absent: no RoPE
  s.cache = take(DType::kBFloat16, {d.pool_pages(), d.kvh(), md::kPageSize, md::kCacheRowWidth});
  s.positions = take(DType::kInt64, {kTokens});
  s.slots = take(DType::kInt64, {kTokens});
  s.qkv = take(DType::kBFloat16, {kTokens, d.n()});
  s.front_ws = take(DType::kUInt8, {md::qkv_front_workspace_bytes(d.kvh(), sms)});
  s.table = take(DType::kInt32, {1, d.table_width()});
  s.lens = take(DType::kInt32, {1});
  s.attn = take(DType::kBFloat16, {kTokens, d.k_in()});
  // One key slice needs no workspace; 16 bytes keep the binding the same.
  s.attn_ws = take(DType::kUInt8, {std::max<int64_t>(md::attn2_workspace_bytes(1, d.kvh(), d.splits()), 16)});
  s.w_o = take(DType::kBFloat16, {md::kOProjOutWidth, d.k_in()});
  s.hidden = take(DType::kBFloat16, {kTokens, md::kHiddenSize});
  s.block_ws = take(DType::kUInt8, {d.block_workspace_bytes()});
  s.logits = take(DType::kFloat32, {kTokens, md::kNumExperts});
  s.bias = take(DType::kFloat32, {md::kNumExperts});
  s.ids = take(DType::kInt32, {kTokens, md::kTopK});
  s.weights = take(DType::kFloat32, {kTokens, md::kTopK});
  s.meta = take(DType::kInt32, {md::metadata_size(d.tile_n)});
  return s;
}

// ---------------------------------------------------------------------------
// What vLLM's attention layer carries, as the ops' "why not" checks read it.
md::ProjectionDesc front_desc(const Deployment& d, const Step& s) {
  md::ProjectionDesc front;
  front.tp_size = d.tp;
  front.weight = s.w_qkv;
  front.num_heads = d.heads();
  front.num_kv_heads = d.kvh();
  front.use_rope = front.rotary.present = d.sliding;
  front.rotary.cos_sin = s.cos_sin;
  return front;
}

md::Attn2Layer attn2_desc(const Deployment& d) {
  md::Attn2Layer layer;
  layer.num_kv_heads = d.kvh();
  layer.num_heads = d.heads();
  return layer;
}

md::OutProjectionDesc o_proj_desc(const Deployment& d, const Step& s) {
  md::OutProjectionDesc out;
  out.tp_size = d.tp;
  out.num_heads = d.heads();
  out.weight = s.w_o;
  return out;
}

// The layer as attention_block sees it: the three ops' descriptions and the
// deployment (one request per step here).
md::AttentionBlockLayer block_layer(const Deployment& d, const Step& s) {
  md::AttentionBlockLayer layer;
  layer.projection = front_desc(d, s);
  layer.attention = attn2_desc(d);
  layer.output = o_proj_desc(d, s);
  layer.num_kv_heads = d.kvh();
  layer.max_model_len = d.context;
  layer.max_reqs = 1;
  if (d.sliding) layer.sliding_window = md::kSlidingWindow;
  return layer;
}

// The step's call of attention_block: the chain's inputs, its output o_proj's.
md::AttentionBlockArgs block_args(const Deployment& d, const Step& s) {
  md::AttentionBlockArgs a;
  a.x = s.x;
  a.qkv_weight = s.w_qkv;
  a.positions = s.positions;
  a.cos_sin = s.cos_sin;
  a.slot_mapping = s.slots;
  a.kv_cache = s.cache;
  a.num_kv_heads = d.kvh();
  a.block_table = s.table;
  a.seq_lens = s.lens;
  a.max_model_len = d.context;
  a.window = d.window();
  a.o_proj_weight = s.w_o;
  a.out = s.hidden;
  a.workspace = s.block_ws;
  return a;
}

// Why the step keeps the three ops (the layer's reason first, then the
// call's), or nullopt where attention_block takes it.
std::optional<std::string> why_not_block(const Deployment& d, const Step& s) {
  if (!d.block) return std::string("--no-block was given");
  if (auto why = md::unsupported_attention_block(block_layer(d, s))) return why;
  return md::unsupported_attention_block_call(block_args(d, s));
}

// ---------------------------------------------------------------------------
// Host part.
bool host_part(const Deployment& d, int sms) {
  const Step s = lay_out(d, kPlaceholder, 0, sms);
  std::printf("TP%d rank: %d KV heads, %d query heads, experts [0, %d); %s layer, max_model_len %d\n", d.tp,
              d.kvh(), d.heads(), d.experts(), d.sliding ? "sliding-window" : "full-attention", d.context);

  // Once per layer, when the engine loads it: do the fused ops take it? Each
  // check returns the reason or nothing; a refused layer keeps the stock path.
  md::RouterDesc router;  // sigmoid, top-8 of 256, output multiplier already folded
  router.expert_bias = s.bias;
  const std::pair<const char*, std::optional<std::string>> why_not[] = {
      {"qkv_front", md::unsupported_projection(front_desc(d, s))},
      {"attn2", md::unsupported_attn2(attn2_desc(d))},
      {"o_proj", md::unsupported_o_proj(o_proj_desc(d, s))},
      {"route", md::unsupported_router(router)}};
  bool ok = true;
  for (const auto& [op, why] : why_not) {
    std::printf("  %-9s %s\n", op, why ? why->c_str() : "takes this layer");
    ok = ok && !why;
  }
  // The three ops in one launch, where the layer and the step's call allow
  // it; a refusal is no failure: the step keeps the three ops.
  const auto block_why = why_not_block(d, s);
  std::printf("  attention_block %s\n",
              block_why ? ("refused, the step keeps the three ops: " + *block_why).c_str()
                        : "takes this layer and the step's call");

  // The grid and the workspaces depend on the deployment, never on a step's
  // lengths: that is what lets one graph serve every step.
  const std::string block_ws = block_why ? "-" : std::to_string(s.block_ws.span_bytes()) + " B";
  std::printf("  sizing: window %d, %d key slice(s), attn2 workspace %lld B, qkv_front workspace %lld B (%d SMs),"
              " attention_block workspace %s, metadata %lld int32 (tile %d); %.1f MB of device memory for the step\n",
              d.window(), d.splits(), (long long)md::attn2_workspace_bytes(1, d.kvh(), d.splits()),
              (long long)s.front_ws.span_bytes(), sms, block_ws.c_str(), (long long)md::metadata_size(d.tile_n),
              d.tile_n, s.bytes / 1e6);

  // Per call: the step's routing is taken; two requests' 16 tokens are not
  // (route serves 1..8), and the reason names the argument.
  md::RouteArgs call;
  call.logits = s.logits;
  call.expert_bias = s.bias;
  call.ids = s.ids;
  call.weights = s.weights;
  call.metadata = md::RoutingMetadata{s.meta, 0, d.experts(), d.tile_n};
  const auto taken = md::unsupported_route_call(call);
  call.logits.shape[0] = 2 * kTokens;
  const auto refused = md::unsupported_route_call(call);
  std::printf("  route of %d tokens: %s; of %d tokens: %s\n", kTokens, taken ? taken->c_str() : "taken",
              2 * kTokens, refused ? refused->c_str() : "taken (unexpected)");
  ok = ok && !taken && refused;

  // The CPU references run anywhere: route and its metadata on one step's
  // tokens. What the routed GEMMs rely on: each token's weights sum to the
  // route scale over 8 distinct experts, and every route to this rank's
  // experts has a row that leads back to its token.
  std::mt19937 rng(1);
  const auto logits = support::random_f32(kTokens * md::kNumExperts, support::kLogitScale, rng);
  const auto bias = support::random_f32(md::kNumExperts, support::kBiasScale, rng);
  std::vector<int32_t> ids(kTokens * md::kTopK), meta(md::metadata_size(d.tile_n), -1);
  std::vector<float> weights(ids.size());
  ref::route(logits.data(), kTokens, bias.data(), 1.0f, ids.data(), weights.data());
  ref::routing_metadata(ids.data(), kTokens, 0, d.experts(), d.tile_n, meta.data());
  int bad = 0, local = 0;
  for (int t = 0; t < kTokens; ++t) {
    std::vector<int32_t> row(&ids[t * 8], &ids[t * 8 + 8]);
    std::sort(row.begin(), row.end());
    bad += std::adjacent_find(row.begin(), row.end()) != row.end();
    bad += std::fabs(std::accumulate(&weights[t * 8], &weights[t * 8 + 8], 0.0) - 1.0) > 1e-5;
  }
  for (int r = 0; r < kTokens * md::kTopK; ++r) {
    const int p = meta[md::kMetaExpandedToPermuted + r];
    if (ids[r] < d.experts()) {
      ++local;
      bad += p < 0 || meta[md::kMetaPermutedToToken + p] != r / md::kTopK;
    } else {
      bad += p != -1;
    }
  }
  std::printf("  CPU reference: route of %d tokens, %d of %d routes to this rank's experts: %s\n", kTokens, local,
              kTokens * md::kTopK, bad ? "FAIL" : "consistent");
  return ok && bad == 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// GPU part.
#ifdef MUSE_DECODE_WITH_CUDA
namespace {

using support::cuda_ok;

template <typename T>
void upload(const TensorRef& dst, const std::vector<T>& src, cudaStream_t stream) {
  cuda_ok(cudaMemcpyAsync(dst.data, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, stream), "upload");
}

template <typename T>
std::vector<T> download(const TensorRef& src, cudaStream_t stream) {
  std::vector<T> h(src.span_bytes() / sizeof(T));
  cuda_ok(cudaMemcpyAsync(h.data(), src.data, h.size() * sizeof(T), cudaMemcpyDeviceToHost, stream), "download");
  cuda_ok(cudaStreamSynchronize(stream), "download");
  return h;
}

// What the host holds of the layer and of one step's inputs.
struct HostLayer {
  std::vector<uint16_t> w_qkv, w_o;
  std::vector<float> cos_sin, bias;
};
struct HostStep {
  std::vector<uint16_t> x;
  std::vector<float> logits;
  std::vector<int64_t> positions, slots;
  std::vector<int32_t> table, lens;
};

// The routing of one replay against the reference: exact, but an id may
// differ where two keys tie to within the last bit of expf.
bool check_route(const Deployment& d, const Step& s, const HostLayer& l, const HostStep& in, cudaStream_t stream) {
  const auto ids = download<int32_t>(s.ids, stream), meta = download<int32_t>(s.meta, stream);
  const auto weights = download<float>(s.weights, stream);
  const support::RouteDiff route = support::route_diff(in.logits.data(), kTokens, l.bias.data(), ids.data(),
                                                       weights.data(), meta.data(), 0, d.experts(), d.tile_n);
  return route.ids_apart == 0 && route.weights_off == 0 && !route.metadata_differs;
}

// One replay's outputs against the CPU references (support/step_checks.h),
// each op on what it read (the op before's output from the GPU): relative
// RMS <= 5e-3 per head or row, the cache rows and the routing exact.
bool check_step(const Deployment& d, const Step& s, const HostLayer& l, const HostStep& in, cudaStream_t stream) {
  const auto qkv = download<uint16_t>(s.qkv, stream), attn = download<uint16_t>(s.attn, stream);
  const auto hidden = download<uint16_t>(s.hidden, stream), cache = download<uint16_t>(s.cache, stream);

  // qkv_front: projection, q/k norm and RoPE in double; the 8 tokens' cache
  // rows hold the bits of its k and v columns. attn2 on the GPU's q, gate
  // and cache (its 8 new keys included), every KV head; o_proj on the GPU's
  // attention rows.
  const double front_err =
      support::qkv_front_error(in.x.data(), kTokens, l.w_qkv.data(), d.kvh(), in.positions.data(),
                               d.sliding ? l.cos_sin.data() : nullptr, d.context, qkv.data());
  const int cache_off = support::cache_values_off(cache.data(), qkv.data(), in.slots.data(), kTokens, d.kvh());
  const ref::Attn2Inputs a = support::attn2_inputs(qkv.data(), d.kvh(), cache.data(), in.table.data(),
                                                   d.table_width(), in.lens.data(), d.window());
  double attn_err = 0;
  for (int kv = 0; kv < d.kvh(); ++kv) attn_err = std::max(attn_err, support::attn2_error(a, 0, kv, attn.data()));
  const double o_err = support::o_proj_error(attn.data(), kTokens, d.k_in(), l.w_o.data(), hidden.data());
  const bool route_ok = check_route(d, s, l, in, stream);

  const bool pass = front_err <= 5e-3 && cache_off == 0 && attn_err <= 5e-3 && o_err <= 5e-3 && route_ok;
  std::printf("  L %5d: qkv_front %.1e (%d cache values off), attn2 %.1e, o_proj %.1e, route %s: %s\n", in.lens[0],
              front_err, cache_off, attn_err, o_err, route_ok ? "exact" : "differs", pass ? "pass" : "FAIL");
  return pass;
}

// The same for a replay of attention_block, whose only attention output is
// o_proj's rows: those against its reference (reference::attention_block_exact:
// the three references chained, qkv_front's and attn2's rows rounded to bf16
// as the ops store them, o_proj's sums in double), and the 8 tokens' cache
// rows against the reference's k and v (per head: the block's projection
// sums in its own order).
bool check_block_step(const Deployment& d, const Step& s, const HostLayer& l, const HostStep& in,
                      cudaStream_t stream) {
  const auto hidden = download<uint16_t>(s.hidden, stream), cache = download<uint16_t>(s.cache, stream);
  ref::AttentionBlockInputs b;
  b.x = in.x.data();
  b.num_reqs = 1;
  b.qkv_weight = l.w_qkv.data();
  b.num_kv_heads = d.kvh();
  b.positions = in.positions.data();
  b.cos_sin = d.sliding ? l.cos_sin.data() : nullptr;
  b.max_pos = d.context;
  b.slot_mapping = in.slots.data();
  b.num_pages = d.pool_pages();
  b.block_table = in.table.data();
  b.block_table_stride = d.table_width();
  b.seq_lens = in.lens.data();
  b.window = d.window();
  b.o_proj_weight = l.w_o.data();
  const support::BlockError err = support::attention_block_error(b, {0}, hidden.data(), md::kHiddenSize, cache.data());
  const bool route_ok = check_route(d, s, l, in, stream);
  const bool pass = err.out <= 5e-3 && err.cache <= 5e-3 && route_ok;
  std::printf("  L %5d: attention_block out %.1e, cache rows %.1e, route %s: %s\n", in.lens[0], err.out, err.cache,
              route_ok ? "exact" : "differs", pass ? "pass" : "FAIL");
  return pass;
}

bool gpu_part(const Deployment& d) {
  std::printf("GPU: %s\n", md::describe_device().c_str());
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  const int sms = md::sm_count(device);

  // The step's buffers, allocated once and zeroed: the workspaces must start
  // at zero, and every launch leaves them so.
  const support::Device<char> memory(lay_out(d, kPlaceholder, device, sms).bytes);
  const Step s = lay_out(d, memory.ptr, device, sms);
  const support::NonBlockingStream stream;
  cuda_ok(cudaMemsetAsync(memory.ptr, 0, s.bytes, stream), "cudaMemsetAsync");

  // The layer (random here; an engine loads it), its RoPE table (theta
  // 500000, interleaved pairs: cos in 0:32, sin in 32:64) and a cache full of
  // earlier keys.
  std::mt19937 rng(2026);
  HostLayer l{support::random_bf16(s.w_qkv.numel(), support::kQkvWeightScale, rng),
              support::random_bf16(s.w_o.numel(), support::kOProjWeightScale, rng), support::rope_table(d.context),
              support::random_f32(md::kNumExperts, support::kBiasScale, rng)};
  upload(s.w_qkv, l.w_qkv, stream);
  upload(s.w_o, l.w_o, stream);
  upload(s.bias, l.bias, stream);
  if (d.sliding) upload(s.cos_sin, l.cos_sin, stream);
  upload(s.cache, support::random_bf16(s.cache.numel(), support::kActivationScale, rng), stream);
  cuda_ok(cudaStreamSynchronize(stream), "upload");

  // The layer's attention: attention_block where it takes the layer and the
  // step's call (the same checks the host part printed), else the three ops.
  const auto block_why = why_not_block(d, s);
  std::printf("path: %s\n", block_why ? ("qkv_front -> attn2 -> o_proj (attention_block: " + *block_why + ")").c_str()
                                       : "attention_block (qkv_front, attn2 and o_proj in one launch)");

  // Bind the ops to the layer's tensors: each constructor checks them once
  // and prepares the device (kernel attributes, the driver's tensor-map
  // encoder), which must happen outside graph capture.
  std::optional<md::AttentionBlock> block;
  std::optional<md::QkvFront> front;
  std::optional<md::Attn2> attn;
  std::optional<md::OProj> o_proj;
  if (!block_why) {
    block.emplace(s.w_qkv, s.cos_sin, s.cache, d.kvh(), s.w_o, d.context, d.window(), s.block_ws);
  } else {
    front.emplace(s.w_qkv, s.cos_sin, s.cache, d.kvh(), s.front_ws);
    attn.emplace(s.cache, s.attn_ws, d.context, d.window(), d.splits());
    o_proj.emplace(s.w_o);
  }
  md::RouterDesc router;
  router.expert_bias = s.bias;
  const md::MuseRouting routing(router);
  const md::QkvViews qg = md::split_qkv(s.qkv, d.kvh());  // attn2 reads q and gate in place
  const md::RoutingMetadata meta{s.meta, 0, d.experts(), d.tile_n};

  // One graph for every step: each op's launch with programmatic dependent
  // launch (the default), so it starts while the one before it ends. The
  // graph holds addresses; positions, lengths and block tables are read from
  // device memory when it replays. route's logits stand for the router GEMM's
  // output, which is the engine's own (cuBLAS), not this library's.
  support::Graph graph;
  support::capture(graph, stream, 1, [&](int) {
    if (block) {
      (*block)(s.x, s.positions, s.slots, s.table, s.lens, s.hidden, stream);
    } else {
      (*front)(s.x, s.positions, s.slots, s.qkv, stream);
      (*attn)(qg.q, qg.gate, s.table, s.lens, s.attn, stream);
      (*o_proj)(s.attn, s.hidden, stream);
    }
    routing(s.logits, s.ids, s.weights, meta, stream);
  });

  // Each step accepts 0..7 drafts plus one token, so the request grows by
  // 1..8 keys, up to the context. Its pages are drawn afresh from the pool
  // every step: a graph that read a stale table would fail the checks.
  std::vector<int32_t> pool(d.pool_pages());
  std::iota(pool.begin(), pool.end(), 0);
  int len = std::max(kTokens, d.context - kTokens * (d.steps - 1));
  bool pass = true;
  for (int step = 0; step < d.steps; ++step) {
    if (step > 0) len = std::min(d.context, len + 1 + int(rng() % 8));
    std::shuffle(pool.begin(), pool.end(), rng);
    HostStep in{support::random_bf16(size_t(kTokens) * md::kHiddenSize, support::kActivationScale, rng),
                support::random_f32(size_t(kTokens) * md::kNumExperts, support::kLogitScale, rng),
                std::vector<int64_t>(kTokens), std::vector<int64_t>(kTokens),
                std::vector<int32_t>(pool.begin(), pool.begin() + d.table_width()), {len}};
    support::step_positions(len, in.table.data(), in.positions.data(), in.slots.data());
    upload(s.x, in.x, stream);
    upload(s.logits, in.logits, stream);
    upload(s.positions, in.positions, stream);
    upload(s.slots, in.slots, stream);
    upload(s.table, in.table, stream);
    upload(s.lens, in.lens, stream);
    // route writes only the metadata entries a step uses: clear the buffer
    // so that the check can compare all of it.
    cuda_ok(cudaMemsetAsync(s.meta.data, 0xff, s.meta.span_bytes(), stream), "cudaMemsetAsync");
    cuda_ok(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
    cuda_ok(cudaStreamSynchronize(stream), "the step's replay");
    pass = (block ? check_block_step(d, s, l, in, stream) : check_step(d, s, l, in, stream)) && pass;
  }
  return pass;
}

}  // namespace
#endif  // MUSE_DECODE_WITH_CUDA

// ---------------------------------------------------------------------------
namespace {

const char* kUsage =
    "usage: engine_step [--tp 1|2|4|8] [--context L] [--steps N] [--layer sliding|full] [--no-block]\n"
    "  One Muse Spark layer's verify step (8 tokens, one request) on rank 0 of a TP group: host checks,\n"
    "  then on an SM90/SM100 GPU the step captured in one CUDA graph, replayed N times with new positions,\n"
    "  lengths and block tables, and checked against the CPU references. The attention runs as\n"
    "  attention_block (one launch) where it serves, else as qkv_front -> attn2 -> o_proj; --no-block\n"
    "  takes the three ops always. Defaults: TP8, L 4096, 4 steps, a sliding-window layer. Exit status 0\n"
    "  when every check passes.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "engine_step: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

int int_flag(int argc, char** argv, int& i, int lo, int hi) {
  const std::string name = argv[i];
  char* end = nullptr;
  const long v = i + 1 < argc ? std::strtol(argv[++i], &end, 10) : 0;
  if (end == nullptr || *end != '\0' || v < lo || v > hi)
    usage_error(name + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return int(v);
}

}  // namespace

int main(int argc, char** argv) {
  Deployment d;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--tp") {
      d.tp = int_flag(argc, argv, i, 1, 8);
      if (md::kNumKvHeads % d.tp != 0 || d.tp > 8) usage_error("--tp takes 1, 2, 4 or 8");
    } else if (a == "--context") {
      d.context = int_flag(argc, argv, i, kTokens, 131072);
    } else if (a == "--steps") {
      d.steps = int_flag(argc, argv, i, 1, 64);
    } else if (a == "--no-block") {
      d.block = false;
    } else if (a == "--layer" && i + 1 < argc && (std::string(argv[i + 1]) == "sliding" || std::string(argv[i + 1]) == "full")) {
      d.sliding = std::string(argv[++i]) == "sliding";
    } else {
      usage_error(a == "--layer" ? "--layer takes sliding or full" : "unknown option '" + a + "'");
    }
  }
  try {
    const bool gpu = md::built_with_cuda() && md::supported_family(md::gpu_family());
    bool ok = host_part(d, gpu ? md::sm_count() : kH200Sms);
    if (!gpu) {
      std::printf("no GPU part: %s\n", md::built_with_cuda()
                                           ? (md::describe_device() + "; the ops need an SM90 or SM100 GPU").c_str()
                                           : "the library was built without CUDA (MUSE_DECODE_CUDA=OFF)");
    }
#ifdef MUSE_DECODE_WITH_CUDA
    if (gpu) ok = gpu_part(d) && ok;
#endif
    std::printf("engine_step: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_step: %s\n", e.what());
    return 1;
  }
}
