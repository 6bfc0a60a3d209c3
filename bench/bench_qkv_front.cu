// Benchmark of qkv_front on the H200 shapes of SPEC section 9: TP8 (2 KV
// heads, N = 2304, 37.7 MB of weight) and TP1 (16 KV heads, N = 18432,
// 302 MB), every T from 1 to 16, RoPE layer, with and without programmatic
// dependent launch.
//
// Timing: CUDA-graph replay of `calls` launches per graph, each launch on its
// own copy of the weight (copies rotate over >= 256 MiB, more than 4x the 60 MB
// L2, so every launch reads its weight from HBM), median of 7 replays after 2
// warm-ups; us_per_call = median replay / calls. With pdl = 1 consecutive
// launches overlap the next one's weight prefetch with this one's tail, as
// qkv_front overlaps the kernel before it in a decoder layer.
//
// Same-run anchors on the same buffers: a naive streaming read of the weight
// (16-byte loads, 4 CTAs of 256 threads per SM, the SPEC's calibration
// kernel) and cudaMemcpyAsync of the weight (copy bandwidth: read + write).
//
// Usage: bench_qkv_front [--json PATH] [--quick]
#include <cuda_runtime.h>

#include "graph_timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/qkv_front.h"

namespace md = muse_decode;
using md::DType;


namespace {

using md::timing::kCopyBandwidth;
constexpr int kMaxPos = 4096;
constexpr int kPages = 256;

__global__ void fill_bf16(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const float u = static_cast<float>((z >> 40) & 0xFFFFFF) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
    const float v = u * 0.04f;
    const uint32_t bits = __float_as_uint(v);
    p[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

// The SPEC's naive streaming read: 16-byte loads, 4 in flight per thread.
__global__ void read_anchor(const uint4* __restrict__ p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += stride) acc ^= __ldcs(p + i).x;
  if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the loads alive
}

using Timing = md::timing::GraphTiming;
using md::timing::time_graph;

struct Row {
  std::string shape;
  int kvh, n, T, pdl;
  double us, floor_us, bar_us, gbps, pct;
  int64_t bytes;
};

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (!md::supported_family(md::gpu_family())) {
    std::printf("bench_qkv_front: no supported GPU (%s)\n", md::describe_device().c_str());
    return 0;
  }
  std::printf("# %s\n", md::describe_device().c_str());
  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  const auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (json) std::fprintf(json, "%s\n", line.c_str());
  };
  md::prepare_qkv_front();
  cudaStream_t stream;
  CUDA_CHECK_OR_EXIT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int sms = md::sm_count();
  std::vector<Row> rows;
  std::vector<std::string> anchors;

  for (int kvh : {2, 16}) {
    const int n = md::qkv_width(kvh);
    const int64_t wbytes = int64_t{n} * md::kHiddenSize * 2;
    const int copies = std::max<int>(2, static_cast<int>((int64_t{256} << 20) / wbytes + 1));
    const int calls = kvh == 2 ? 40 : 16;
    // SPEC section 9 bars: TP8 1.15x the 8.8 us weight-read floor; TP1 1.1x
    // (the issue's 70 us floor: the stricter of the numbers it states).
    const double bar_us = kvh == 2 ? 1.15 * 8.8 : 1.1 * 70.0;
    const char* shape = kvh == 2 ? "TP8" : "TP1";

    uint16_t* w = nullptr;
    CUDA_CHECK_OR_EXIT(cudaMalloc(&w, wbytes * copies));
    fill_bf16<<<4 * sms, 256>>>(w, static_cast<size_t>(wbytes / 2) * copies, 1234 + kvh);
    CUDA_CHECK_OR_EXIT(cudaGetLastError());
    uint16_t *x, *out, *cache;
    int64_t *pos, *slots;
    float* cs;
    int32_t* ws;
    CUDA_CHECK_OR_EXIT(cudaMalloc(&x, 16 * 8192 * 2));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&out, int64_t{16} * n * 2));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&cache, int64_t{kPages} * kvh * 16 * 128 * 2));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&pos, 16 * 8));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&slots, 16 * 8));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&cs, kMaxPos * 64 * 4));
    const int64_t ws_bytes = md::qkv_front_workspace_bytes_for_device(kvh);
    CUDA_CHECK_OR_EXIT(cudaMalloc(&ws, ws_bytes));
    CUDA_CHECK_OR_EXIT(cudaMemset(ws, 0, ws_bytes));
    fill_bf16<<<64, 256>>>(x, 16 * 8192, 99);
    std::vector<float> table(kMaxPos * 64);
    for (int p = 0; p < kMaxPos; ++p)
      for (int j = 0; j < 32; ++j) {
        const double f = p * std::pow(500000.0, -2.0 * j / 64);
        table[p * 64 + j] = static_cast<float>(std::cos(f));
        table[p * 64 + 32 + j] = static_cast<float>(std::sin(f));
      }
    CUDA_CHECK_OR_EXIT(cudaMemcpy(cs, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int64_t> hp(16), hs(16);
    for (int t = 0; t < 16; ++t) {
      hp[t] = 3000 + t;
      hs[t] = (t * 37) % (kPages * 16);
    }
    CUDA_CHECK_OR_EXIT(cudaMemcpy(pos, hp.data(), 16 * 8, cudaMemcpyHostToDevice));
    CUDA_CHECK_OR_EXIT(cudaMemcpy(slots, hs.data(), 16 * 8, cudaMemcpyHostToDevice));
    CUDA_CHECK_OR_EXIT(cudaDeviceSynchronize());

    // One call of T tokens on weight copy `copy`.
    const auto call = [&](int T, int copy, int pdl) {
      md::QkvFrontArgs a;
      a.x = md::make_tensor(x, DType::kBFloat16, {T, 8192});
      a.weight = md::make_tensor(w + static_cast<size_t>(copy % copies) * (wbytes / 2), DType::kBFloat16, {n, 8192});
      a.positions = md::make_tensor(pos, DType::kInt64, {T});
      a.cos_sin = md::make_tensor(cs, DType::kFloat32, {kMaxPos, 64});
      a.slot_mapping = md::make_tensor(slots, DType::kInt64, {T});
      a.kv_cache = md::make_tensor(cache, DType::kBFloat16, {kPages, kvh, 16, 128});
      a.num_kv_heads = kvh;
      a.out = md::make_tensor(out, DType::kBFloat16, {T, n});
      a.workspace = md::make_tensor(ws, DType::kInt32, {ws_bytes / 4});
      a.pdl = pdl != 0;
      md::qkv_front(a, reinterpret_cast<md::Stream>(stream));
    };
    // One eager call before any capture.
    call(1, 0, 0);
    CUDA_CHECK_OR_EXIT(cudaStreamSynchronize(stream));

    // Graph replay of `calls` calls, each on the next weight copy.
    const auto time_calls = [&](int T, int pdl) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_CHECK_OR_EXIT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < calls; ++i) call(T, i, pdl);
      CUDA_CHECK_OR_EXIT(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK_OR_EXIT(cudaGraphInstantiate(&exec, graph, 0));
      const Timing tm = time_graph(exec, stream, calls);
      CUDA_CHECK_OR_EXIT(cudaGraphExecDestroy(exec));
      CUDA_CHECK_OR_EXIT(cudaGraphDestroy(graph));
      return tm;
    };

    for (int pdl : {1, 0})
      for (int T = 1; T <= 16; ++T) {
        if (quick && T != 1 && T != 8 && T != 16) continue;
        const Timing tm = time_calls(T, pdl);
        // Bytes that must move: weight, x, out, cos_sin rows, positions and
        // slots read, k and v rows written to the cache.
        const int64_t bytes = wbytes + int64_t{T} * 8192 * 2 + int64_t{T} * n * 2 + int64_t{T} * 64 * 4 +
                              int64_t{T} * 16 + int64_t{T} * kvh * 128 * 2;
        Row r{shape, kvh, n, T, pdl, tm.median_us, bytes / kCopyBandwidth * 1e6, bar_us, bytes / tm.median_us * 1e-3,
              100.0 * (bytes / (tm.median_us * 1e-6)) / kCopyBandwidth, bytes};
        rows.push_back(r);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"op\": \"qkv_front\", \"shape\": \"%s\", \"num_kv_heads\": %d, \"n\": %d, \"T\": %d, "
                      "\"pdl\": %d, \"rope\": 1, \"calls_per_graph\": %d, \"weight_copies\": %d, \"us_per_call\": %.3f, "
                      "\"us_per_call_min\": %.3f, \"bytes\": %lld, \"floor_us\": %.3f, \"gbps\": %.1f, "
                      "\"pct_of_copy_bw\": %.1f, \"bar_us\": %.2f, \"meets_bar\": %s}",
                      shape, kvh, n, T, pdl, calls, copies, tm.median_us, tm.min_us, static_cast<long long>(bytes),
                      r.floor_us, r.gbps, r.pct, bar_us, tm.median_us <= bar_us ? "true" : "false");
        emit(line);
      }

    // Anchors on the same weight copies.
    {
      uint32_t* sink;
      CUDA_CHECK_OR_EXIT(cudaMalloc(&sink, 4));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_CHECK_OR_EXIT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < calls; ++i)
        read_anchor<<<4 * sms, 256, 0, stream>>>(
            reinterpret_cast<const uint4*>(w + static_cast<size_t>(i % copies) * (wbytes / 2)), wbytes / 16, sink);
      CUDA_CHECK_OR_EXIT(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK_OR_EXIT(cudaGraphInstantiate(&exec, graph, 0));
      const Timing rd = time_graph(exec, stream, calls);
      CUDA_CHECK_OR_EXIT(cudaGraphExecDestroy(exec));
      CUDA_CHECK_OR_EXIT(cudaGraphDestroy(graph));
      // Copy: copy i reads copy i and writes copy i+1 (the rotation keeps it out of L2).
      CUDA_CHECK_OR_EXIT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      const int copy_calls = std::max(2, copies - 1);
      for (int i = 0; i < copy_calls; ++i)
        CUDA_CHECK_OR_EXIT(cudaMemcpyAsync(w + static_cast<size_t>((i + 1) % copies) * (wbytes / 2),
                           w + static_cast<size_t>(i % copies) * (wbytes / 2), wbytes, cudaMemcpyDeviceToDevice,
                           stream));
      CUDA_CHECK_OR_EXIT(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK_OR_EXIT(cudaGraphInstantiate(&exec, graph, 0));
      const Timing cp = time_graph(exec, stream, copy_calls);
      CUDA_CHECK_OR_EXIT(cudaGraphExecDestroy(exec));
      CUDA_CHECK_OR_EXIT(cudaGraphDestroy(graph));
      CUDA_CHECK_OR_EXIT(cudaFree(sink));
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"op\": \"anchor_naive_read\", \"shape\": \"%s\", \"bytes\": %lld, \"us_per_call\": %.3f, "
                    "\"gbps\": %.1f}",
                    shape, static_cast<long long>(wbytes), rd.median_us, wbytes / rd.median_us * 1e-3);
      emit(line);
      anchors.push_back(line);
      std::snprintf(line, sizeof line,
                    "{\"op\": \"anchor_memcpy\", \"shape\": \"%s\", \"bytes_moved\": %lld, \"us_per_call\": %.3f, "
                    "\"gbps\": %.1f}",
                    shape, static_cast<long long>(2 * wbytes), cp.median_us, 2 * wbytes / cp.median_us * 1e-3);
      emit(line);
      anchors.push_back(line);
    }
    CUDA_CHECK_OR_EXIT(cudaFree(w));
    CUDA_CHECK_OR_EXIT(cudaFree(x));
    CUDA_CHECK_OR_EXIT(cudaFree(out));
    CUDA_CHECK_OR_EXIT(cudaFree(cache));
    CUDA_CHECK_OR_EXIT(cudaFree(pos));
    CUDA_CHECK_OR_EXIT(cudaFree(slots));
    CUDA_CHECK_OR_EXIT(cudaFree(cs));
    CUDA_CHECK_OR_EXIT(cudaFree(ws));
  }
  if (json) std::fclose(json);

  std::printf("\n%-5s %3s %4s %9s %9s %8s %7s %6s %s\n", "shape", "T", "pdl", "us/call", "floor_us", "bar_us",
              "%copy", "x_flr", "bar");
  for (const Row& r : rows)
    std::printf("%-5s %3d %4d %9.2f %9.2f %8.2f %7.1f %6.3f %s\n", r.shape.c_str(), r.T, r.pdl, r.us, r.floor_us,
                r.bar_us, r.pct, r.us / r.floor_us, r.us <= r.bar_us ? "ok" : "MISS");
  for (const auto& a : anchors) std::printf("%s\n", a.c_str());
  CUDA_CHECK_OR_EXIT(cudaStreamDestroy(stream));
  return 0;
}
