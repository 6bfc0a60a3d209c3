// The verify step on the GPU: qkv_front, attn2 and route of one layer, over
// several layers' worth of random weights and caches, each op checked against
// the CPU reference on the first layer and timed (CUDA-graph replay, L2
// flushed before each replay) beside the unfused path of the same inputs.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <stdexcept>
#include <vector>

#include "graph_timing.h"
#include "muse_decode/arch.h"
#include "muse_decode/attn2.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"
#include "unfused.h"
#include "verify_step.h"

namespace muse_decode::tool {
namespace {

using timing::cuda_ok;

template <typename T>
struct Device {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) { cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T) + 64), "cudaMalloc"); }
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  // Synchronizes the device: a pageable upload may still be in flight when
  // cudaMemcpy returns, and the tool's stream is non-blocking.
  void upload(const std::vector<T>& h, size_t offset = 0) const {
    cuda_ok(cudaMemcpy(ptr + offset, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  std::vector<T> download(size_t count, size_t offset = 0) const {
    std::vector<T> h(count);
    cuda_ok(cudaMemcpy(h.data(), ptr + offset, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = reference::float_to_bf16_bits(dist(rng));
  return v;
}

void note(const Deployment& d, const char* what) {
  if (d.progress) std::fprintf(stderr, "muse-decode: %s\n", what);
}

// The worst relative RMS error of `got` (bf16 bits) against `ref` over each
// `group` consecutive columns of a row: a 64-wide head, or a whole row.
double worst_group_error(const std::vector<uint16_t>& got, const std::vector<double>& ref, int rows, int64_t width,
                        int64_t got_stride, int64_t group = kHeadDim) {
  double worst = 0;
  for (int r = 0; r < rows; ++r)
    for (int64_t h = 0; h < width / group; ++h) {
      double num = 0, den = 0;
      for (int64_t d = 0; d < group; ++d) {
        const double g = reference::bf16_bits_to_float(got[r * got_stride + h * group + d]);
        const double x = ref[r * width + h * group + d];
        if (!std::isfinite(g)) return INFINITY;
        num += (g - x) * (g - x);
        den += x * x;
      }
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    }
  return worst;
}

struct Graph {
  cudaGraphExec_t exec = nullptr;
  int calls = 0;
  ~Graph() { if (exec) cudaGraphExecDestroy(exec); }
};

template <typename F>
void capture(Graph& g, cudaStream_t s, int calls, F&& call) {
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < calls; ++i) call(i);
  cuda_ok(cudaStreamEndCapture(s, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&g.exec, graph, 0), "instantiate");
  cudaGraphDestroy(graph);
  g.calls = calls;
}

}  // namespace

// A build with -DMUSE_DECODE_TRACE=ON defines the dumps of the kernels'
// phase stamps (src/common/trace.cuh). With MUSE_DECODE_TRACE_DIR set, the
// tool writes attn2's ring after timing attn2 alone
// (trace_attn2_<tp>_<context>_<layer>.bin) and all three rings after timing
// the block (trace_block_<op>_<tp>_<context>_<layer>.bin), for bench/trace.py.
extern "C" int muse_decode_dump_attn2_trace(const char* path) __attribute__((weak));
extern "C" int muse_decode_dump_qkv_front_trace(const char* path) __attribute__((weak));
extern "C" int muse_decode_dump_o_proj_trace(const char* path) __attribute__((weak));

namespace {
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
}  // namespace

std::vector<OpResult> run_gpu(const Deployment& d) {
  const int kvh = 16 / d.tp, heads = kHeadsPerKvHead * kvh, n = qkv_width(kvh);
  const int R = d.requests, T = kVerifyLen * R, L = d.context;
  const int pages_per_req = (L + kPageSize - 1) / kPageSize;
  const int window = attn2_window(d.sliding ? std::optional<int>(kSlidingWindow) : std::nullopt, L);
  const int splits = attn2_splits(L, window, kvh);
  const int local = kNumExperts / d.tp;
  const int k_in = heads * kHeadDim;  // o_proj's input width
  const double weight_bytes = double(n) * kHiddenSize * 2;
  const double o_weight_bytes = double(kHiddenSize) * k_in * 2;
  const double cache_bytes = double(R) * pages_per_req * kvh * kPageSize * 128 * 2;
  const int layers =
      d.layers ? d.layers
               : std::clamp(int(std::ceil(3 * 60e6 / (weight_bytes + o_weight_bytes + cache_bytes))), 2, 16);
  // Each op alone rotates its own inputs past three times the L2: the front's
  // and o_proj's weights get copies of their own beyond the layers' (at 128k
  // two layers' caches are enough, but two o_proj weights, 34 MB, would sit
  // in the 60 MB L2). Call i reads weight copy i % w_copies, o_proj weight
  // i % wo_copies and cache i % layers.
  const int w_copies = std::max(layers, int(std::ceil(3 * 60e6 / weight_bytes)));
  const int wo_copies = std::max(layers, int(std::ceil(3 * 60e6 / o_weight_bytes)));
  std::mt19937 rng(2026);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  prepare_attn2();
  prepare_qkv_front();
  prepare_route();
  prepare_o_proj();

  note(d, "allocating random weights and caches");
  Device<uint16_t> x(size_t(T) * kHiddenSize), w(size_t(w_copies) * n * kHiddenSize), out(size_t(T) * n),
      attn(size_t(T) * heads * kHeadDim), cache(size_t(layers) * R * pages_per_req * kvh * kPageSize * 128),
      wo(size_t(wo_copies) * kHiddenSize * k_in), hidden(size_t(T) * kHiddenSize);
  Device<float> cos_sin(size_t(L) * 64), scratch(size_t(T) * heads * kHeadDim);
  Device<int64_t> positions(T), slots(T);
  Device<int32_t> table(size_t(R) * pages_per_req), lens(R);
  x.upload(random_bf16(x.n, 1.0f, rng));
  for (int c = 0; c < w_copies; ++c) w.upload(random_bf16(size_t(n) * kHiddenSize, 0.02f, rng), size_t(c) * n * kHiddenSize);
  for (int l = 0; l < layers; ++l) cache.upload(random_bf16(cache.n / layers, 1.0f, rng), cache.n / layers * l);
  for (int c = 0; c < wo_copies; ++c)
    wo.upload(random_bf16(size_t(kHiddenSize) * k_in, 0.03f, rng), size_t(c) * kHiddenSize * k_in);
  std::vector<float> cs(size_t(L) * 64);
  for (int p = 0; p < L; ++p)
    for (int j = 0; j < 32; ++j) {
      const double a = p * std::pow(kRopeTheta, -2.0 * j / kHeadDim);
      cs[p * 64 + j] = float(std::cos(a));
      cs[p * 64 + 32 + j] = float(std::sin(a));
    }
  cos_sin.upload(cs);
  std::vector<int32_t> perm(size_t(R) * pages_per_req), h_table(perm.size()), h_lens(R, L);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  h_table = perm;  // request r's pages: perm[r * pages_per_req ...]
  std::vector<int64_t> h_pos(T), h_slots(T);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < kVerifyLen; ++i) {
      const int p = L - kVerifyLen + i;
      h_pos[r * 8 + i] = p;
      h_slots[r * 8 + i] = int64_t(h_table[r * pages_per_req + p / kPageSize]) * kPageSize + p % kPageSize;
    }
  table.upload(h_table);
  lens.upload(h_lens);
  positions.upload(h_pos);
  slots.upload(h_slots);
  const bool rope = d.sliding;
  const size_t front_ws_bytes = size_t(qkv_front_workspace_bytes_for_device(kvh));
  const size_t attn_ws_bytes = size_t(std::max<int64_t>(attn2_workspace_bytes(R, kvh, splits), 16));
  Device<uint8_t> front_ws(front_ws_bytes), attn_ws(attn_ws_bytes);
  cuda_ok(cudaMemset(front_ws.ptr, 0, front_ws_bytes), "memset");
  cuda_ok(cudaMemset(attn_ws.ptr, 0, attn_ws_bytes), "memset");
  cuda_ok(cudaDeviceSynchronize(), "memset");  // the legacy stream's memsets before the tool's stream
  const size_t layer_cache = cache.n / layers;

  auto front_call = [&](int l, bool pdl = true) {  // qkv_front over all T tokens, 16 at a time
    for (int t0 = 0; t0 < T; t0 += kFrontMaxTokens) {
      const int tn = std::min(kFrontMaxTokens, T - t0);
      QkvFrontArgs a;
      a.x = make_tensor(x.ptr + size_t(t0) * kHiddenSize, DType::kBFloat16, {tn, kHiddenSize});
      a.weight = make_tensor(w.ptr + size_t(l % w_copies) * n * kHiddenSize, DType::kBFloat16, {n, kHiddenSize});
      a.positions = make_tensor(positions.ptr + t0, DType::kInt64, {tn});
      if (rope) a.cos_sin = make_tensor(cos_sin.ptr, DType::kFloat32, {L, 64});
      a.slot_mapping = make_tensor(slots.ptr + t0, DType::kInt64, {tn});
      a.kv_cache = make_tensor(cache.ptr + layer_cache * (l % layers), DType::kBFloat16,
                               {int64_t(R) * pages_per_req, kvh, kPageSize, 128});
      a.num_kv_heads = kvh;
      a.out = make_tensor(out.ptr + size_t(t0) * n, DType::kBFloat16, {tn, n});
      a.workspace = make_tensor(front_ws.ptr, DType::kUInt8, {int64_t(front_ws_bytes)});
      a.pdl = pdl;
      qkv_front(a, reinterpret_cast<Stream>(stream));
    }
  };
  auto attn_call = [&](int l, bool pdl = true) {
    Attn2Args a;
    TensorRef q = make_tensor(out.ptr, DType::kBFloat16, {T, heads * kHeadDim});
    q.stride[0] = n;
    TensorRef gate = q;
    gate.data = out.ptr + size_t(heads + 2 * kvh) * kHeadDim;
    a.q = q;
    a.gate = gate;
    a.kv_cache = make_tensor(cache.ptr + layer_cache * (l % layers), DType::kBFloat16,
                             {int64_t(R) * pages_per_req, kvh, kPageSize, 128});
    a.block_table = make_tensor(table.ptr, DType::kInt32, {R, pages_per_req});
    a.seq_lens = make_tensor(lens.ptr, DType::kInt32, {R});
    a.out = make_tensor(attn.ptr, DType::kBFloat16, {T, heads * kHeadDim});
    if (splits > 1) a.workspace = make_tensor(attn_ws.ptr, DType::kUInt8, {int64_t(attn_ws_bytes)});
    a.max_model_len = L;
    a.window = window;
    a.num_splits = splits;
    a.pdl = pdl;
    attn2(a, reinterpret_cast<Stream>(stream));
  };
  auto o_proj_call = [&](int l, bool pdl = true) {  // attn2's rows through this layer's output projection
    OProjArgs a;
    a.x = make_tensor(attn.ptr, DType::kBFloat16, {T, k_in});
    a.weight = make_tensor(wo.ptr + size_t(l % wo_copies) * kHiddenSize * k_in, DType::kBFloat16, {kHiddenSize, k_in});
    a.out = make_tensor(hidden.ptr, DType::kBFloat16, {T, kHiddenSize});
    a.pdl = pdl;
    o_proj(a, reinterpret_cast<Stream>(stream));
  };
  std::vector<OpResult> results;

  // ---- qkv_front: check layer 0 against the CPU reference ---------------------
  front_call(0);
  cuda_ok(cudaStreamSynchronize(stream), "qkv_front");
  {
    note(d, "checking qkv_front against the CPU reference");
    const auto hx = x.download(x.n);
    const auto hw = w.download(size_t(n) * kHiddenSize);
    const auto hout = out.download(out.n);
    const int check_tokens = std::min(T, 8);
    std::vector<double> y(size_t(check_tokens) * n);
    reference::qkv_front(hx.data(), kHiddenSize, check_tokens, hw.data(), kvh, h_pos.data(),
                         rope ? cs.data() : nullptr, L, y.data());
    const double err = worst_group_error(hout, y, check_tokens, n, n);
    // Cache rows: the bits of out's k and v.
    const auto hcache = cache.download(layer_cache);
    int cache_bad = 0;
    for (int t = 0; t < check_tokens; ++t)
      for (int kv = 0; kv < kvh; ++kv)
        for (int dd = 0; dd < 128; ++dd) {
          const int64_t s = h_slots[t];
          const uint16_t c = hcache[((s / kPageSize * kvh + kv) * kPageSize + s % kPageSize) * 128 + dd];
          const int col = dd < 64 ? (heads + kv) * 64 + dd : (heads + kvh + kv) * 64 + dd - 64;
          cache_bad += c != hout[size_t(t) * n + col];
        }
    OpResult r;
    r.op = "qkv_front";
    r.pass = err <= 5e-3 && cache_bad == 0;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%d tokens: worst relative RMS per head %.2e (bar 5e-3), %d cache values differ from out",
                  check_tokens, err, cache_bad);
    r.detail = buf;
    r.bytes = weight_bytes + T * (kHiddenSize + n) * 2.0 + T * kvh * 256.0;
    results.push_back(r);
  }
  // ---- attn2: check requests 0 and R-1, KV heads 0 and KVH-1 of layer 0 --------
  attn_call(0);
  cuda_ok(cudaStreamSynchronize(stream), "attn2");
  {
    note(d, "checking attn2 against the CPU reference");
    const auto hout = out.download(out.n);
    const auto hattn = attn.download(attn.n);
    const auto hcache = cache.download(layer_cache);
    reference::Attn2Inputs in;
    in.q = hout.data();
    in.q_stride = n;
    in.gate = hout.data() + size_t(heads + 2 * kvh) * kHeadDim;
    in.gate_stride = n;
    in.kv_cache = hcache.data();
    in.num_kv_heads = kvh;
    in.block_table = h_table.data();
    in.block_table_stride = pages_per_req;
    in.seq_lens = h_lens.data();
    in.window = window;
    double worst = 0;
    std::vector<double> rows(64 * 64);
    for (int r : {0, R - 1})
      for (int kv : {0, kvh - 1}) {
        // attn2_pair gives this KV head's 8 heads of the 8 rows as [8][8 * 64]:
        // compare them with the same columns of the kernel's rows.
        reference::attn2_pair(in, r, kv, rows.data());
        std::vector<uint16_t> got(8 * 8 * 64);
        for (int i = 0; i < 8; ++i) {
          const uint16_t* row = &hattn[(size_t(r) * 8 + i) * heads * 64 + size_t(kv) * 8 * 64];
          std::copy(row, row + 8 * 64, &got[size_t(i) * 8 * 64]);
        }
        worst = std::max(worst, worst_group_error(got, rows, 8, 512, 512));
      }
    OpResult r;
    r.op = "attn2";
    r.pass = worst <= 5e-3;
    char buf[200];
    std::snprintf(buf, sizeof buf, "requests {0, %d} x KV heads {0, %d}: worst relative RMS per row and head %.2e (bar 5e-3)",
                  R - 1, kvh - 1, worst);
    r.detail = buf;
    const double keys = window ? std::min<double>(L, window + kVerifyLen - 1) : L;
    r.bytes = R * keys * kvh * 256.0 + 3.0 * T * heads * kHeadDim * 2;
    results.push_back(r);
  }
  // ---- o_proj: layer 0's projection of attn2's rows, against the fp64 sums ------
  o_proj_call(0);
  cuda_ok(cudaStreamSynchronize(stream), "o_proj");
  {
    note(d, "checking o_proj against the CPU reference");
    const auto hattn = attn.download(attn.n);
    const auto hwo = wo.download(size_t(kHiddenSize) * k_in);
    const auto hhidden = hidden.download(hidden.n);
    std::vector<double> y(size_t(T) * kHiddenSize);
    reference::o_proj_exact(hattn.data(), k_in, T, hwo.data(), k_in, y.data());
    const double worst = worst_group_error(hhidden, y, T, kHiddenSize, kHiddenSize, kHiddenSize);  // per row
    OpResult r;
    r.op = "o_proj";
    r.pass = worst <= 5e-3;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%d rows: worst relative RMS per row %.2e (bar 5e-3)", T, worst);
    r.detail = buf;
    r.bytes = o_weight_bytes + T * (k_in + kHiddenSize) * 2.0;
    results.push_back(r);
  }
  // ---- route: 8 tokens per call, every request's tokens ------------------------
  const int route_calls = 256;
  std::vector<float> logits(size_t(route_calls) * 8 * kNumExperts), bias(kNumExperts);
  {
    std::normal_distribution<float> nl(0.0f, 2.0f), nb(0.0f, 0.02f);
    for (auto& v : logits) v = nl(rng);
    for (auto& v : bias) v = nb(rng);
  }
  const int64_t md_len = (metadata_size(d.tile_n) + 3) / 4 * 4;
  Device<float> d_logits(logits.size()), d_bias(kNumExperts), d_weights(size_t(route_calls) * 64);
  Device<int32_t> d_ids(size_t(route_calls) * 64), d_md(size_t(route_calls) * md_len);
  d_logits.upload(logits);
  d_bias.upload(bias);
  cuda_ok(cudaMemset(d_md.ptr, 0xff, d_md.n * 4), "memset");
  cuda_ok(cudaDeviceSynchronize(), "memset");
  RouterDesc router;
  router.expert_bias = make_tensor(d_bias.ptr, DType::kFloat32, {kNumExperts});
  const MuseRouting routing(router);
  auto route_call = [&](int i) {
    RoutingMetadata m{make_tensor(d_md.ptr + i * md_len, DType::kInt32, {md_len}), 0, local, d.tile_n};
    routing(make_tensor(d_logits.ptr + size_t(i) * 8 * kNumExperts, DType::kFloat32, {8, kNumExperts}),
            make_tensor(d_ids.ptr + i * 64, DType::kInt32, {8, 8}), make_tensor(d_weights.ptr + i * 64, DType::kFloat32, {8, 8}),
            m, reinterpret_cast<Stream>(stream));
  };
  for (int i = 0; i < route_calls; ++i) route_call(i);
  cuda_ok(cudaStreamSynchronize(stream), "route");
  {
    note(d, "checking route against the CPU reference");
    const auto ids = d_ids.download(d_ids.n);
    const auto wts = d_weights.download(d_weights.n);
    const auto meta = d_md.download(d_md.n);
    int id_diff = 0, w_bad = 0, md_bad = 0;
    for (int i = 0; i < route_calls; ++i) {
      int32_t rid[64];
      float rw[64];
      reference::route(&logits[size_t(i) * 8 * kNumExperts], 8, bias.data(), 1.0f, rid, rw);
      for (int k = 0; k < 64; ++k) {
        id_diff += rid[k] != ids[i * 64 + k];
        w_bad += rid[k] == ids[i * 64 + k] && std::fabs(rw[k] - wts[i * 64 + k]) > 1e-6f * std::fabs(rw[k]) + 1e-9f;
      }
      std::vector<int32_t> expect(md_len, -1);
      reference::routing_metadata(&ids[i * 64], 8, 0, local, d.tile_n, expect.data());
      md_bad += !std::equal(expect.begin(), expect.begin() + metadata_size(d.tile_n), meta.begin() + i * md_len);
    }
    OpResult r;
    r.op = "route";
    // The host expf may differ from CUDA's in the last bit: ids may differ only at near-ties.
    r.pass = w_bad == 0 && md_bad == 0 && id_diff <= route_calls * 64 / 1000;
    char buf[220];
    std::snprintf(buf, sizeof buf, "%d rows: %d ids differ from the host-expf reference (near-ties), %d weights off, %d metadata buffers differ",
                  route_calls * 8, id_diff, w_bad, md_bad);
    r.detail = buf;
    r.bytes = 8 * kNumExperts * 4.0 + kNumExperts * 4.0 + 64 * 8.0;
    results.push_back(r);
  }

  // ---- timing: fused and unfused, by graph replay with the L2 flushed ----------
  Device<char> scrub(size_t(256) << 20);
  auto flush = [&](cudaStream_t s) { cuda_ok(cudaMemsetAsync(scrub.ptr, 1, scrub.n, s), "flush"); };
  auto time_it = [&](int calls, auto&& call) {
    Graph g;
    capture(g, stream, calls, call);
    return timing::time_graph(g.exec, stream, calls, d.replays, flush).median_us;
  };
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  const int op_calls = d.calls ? d.calls : std::max(layers, 40);  // as many as the benchmarks replay
  // The unfused path of call i, reading what the fused call i reads.
  auto unfused_front_call = [&](int i) {
    unfused_front(UnfusedFrontArgs{x.ptr, w.ptr + size_t(i % w_copies) * n * kHiddenSize, positions.ptr,
                                   rope ? cos_sin.ptr : nullptr, slots.ptr, cache.ptr + layer_cache * (i % layers),
                                   out.ptr, T, kvh},
                  cublas, stream);
  };
  auto unfused_attn_call = [&](int i) {
    unfused_attention(UnfusedAttentionArgs{out.ptr, out.ptr + size_t(heads + 2 * kvh) * kHeadDim, n, n,
                                           cache.ptr + layer_cache * (i % layers), table.ptr, pages_per_req, lens.ptr,
                                           scratch.ptr, attn.ptr, R, kvh, window},
                      stream);
  };
  auto unfused_o_proj_call = [&](int i) {
    unfused_o_proj(UnfusedOProjArgs{attn.ptr, wo.ptr + size_t(i % wo_copies) * kHiddenSize * k_in, hidden.ptr, T, k_in},
                   cublas, stream);
  };
  note(d, "timing qkv_front (fused and unfused)");
  results[0].us = time_it(op_calls, [&](int i) { front_call(i); });
  results[0].unfused_us = time_it(op_calls, unfused_front_call);
  note(d, "timing attn2 (fused and unfused)");
  results[1].us = time_it(op_calls, [&](int i) { attn_call(i); });
  dump_trace(muse_decode_dump_attn2_trace, "attn2", d);
  results[1].unfused_us = time_it(std::min(op_calls, 8), unfused_attn_call);
  note(d, "timing route (fused and unfused)");
  results[3].us = time_it(route_calls, route_call);
  results[3].unfused_us = time_it(64, [&](int i) {
    unfused_route(UnfusedRouteArgs{d_logits.ptr + size_t(i) * 8 * kNumExperts, d_bias.ptr, d_ids.ptr + i * 64, d_weights.ptr + i * 64,
                   d_md.ptr + i * md_len, 8, 0, local, d.tile_n},
                  stream);
  });
  note(d, "timing o_proj (fused and cuBLAS)");
  results[2].us = time_it(op_calls, [&](int i) { o_proj_call(i); });
  results[2].unfused_us = time_it(op_calls, unfused_o_proj_call);
  // ---- the attention block: qkv_front, attn2 and o_proj back to back on one
  // stream, each kernel launched with PDL behind the one before, every
  // iteration on another layer's weights and cache -------------------------------
  note(d, "timing the attention block (chained and unfused)");
  {
    OpResult b;
    b.op = "block";
    b.pass = results[0].pass && results[1].pass && results[2].pass;
    // Where the chain's time goes: each junction alone (two ops chained), and
    // the block with every launch plain (no programmatic dependent launch).
    const double front_attn = time_it(op_calls, [&](int i) {
      front_call(i);
      attn_call(i);
    });
    const double attn_oproj = time_it(op_calls, [&](int i) {
      attn_call(i);
      o_proj_call(i);
    });
    const double plain = time_it(op_calls, [&](int i) {
      front_call(i, false);
      attn_call(i, false);
      o_proj_call(i, false);
    });
    // What the block must read: the front's and o_proj's weights and attn2's keys and values; the
    // tokens' rows in and out (x, qkv, attention, o_proj's output, the cache rows written).
    b.bytes = results[0].bytes + results[1].bytes + results[2].bytes;
    b.us = time_it(op_calls, [&](int i) {
      front_call(i);
      attn_call(i);
      o_proj_call(i);
    });
    dump_block_traces("block", d);
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "qkv_front, attn2 and o_proj chained in one graph (checked op by op above); chained pairs: "
                  "qkv_front + attn2 %.2f us, attn2 + o_proj %.2f us; the block without PDL %.2f us",
                  front_attn, attn_oproj, plain);
    b.detail = buf;
    b.unfused_us = time_it(std::min(op_calls, 8), [&](int i) {
      unfused_front_call(i);
      unfused_attn_call(i);
      unfused_o_proj_call(i);
    });
    results.push_back(b);
  }
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  for (auto& r : results) r.floor_us = r.bytes / timing::kCopyBandwidth * 1e6;
  return results;
}

}  // namespace muse_decode::tool
