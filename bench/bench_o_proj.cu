// Benchmark of o_proj on the H200 shapes of the contract: TP8 (K = 1024,
// 16.8 MB of weight) and TP1 (K = 8192, 134 MB), T = 1, 4, 8, 16, 32, 64, with
// and without programmatic dependent launch, and cuBLAS on the same shapes
// in the same run (the anchor: cublasGemmEx, bf16 in and out, fp32
// accumulation, what torch.matmul calls).
//
// Timing: CUDA-graph replay of `calls` launches per graph, each launch on
// its own copy of the weight (copies rotate over >= 320 MiB, more than 5x the
// 60 MB L2, so every launch reads its weight from HBM), median of 7 replays
// after 2 warm-ups; us_per_call = median replay / calls. x and out stay the
// same buffers (x is the previous kernel's output, an L2 hit in a layer).
// With pdl = 1 consecutive launches overlap the next one's weight stream with
// this one's tail, as o_proj overlaps attn2 in a layer; cuBLAS launches plain.
//
// Floor: the weight's bytes at 4.2 TB/s (the H200's measured copy bandwidth);
// % of copy bandwidth counts every byte moved (weight, x, out). Same-run
// anchor: cudaMemcpyAsync of the weight copies (copy bandwidth, read + write).
//
// Usage: bench_o_proj [--json PATH] [--quick]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "graph_timing.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/o_proj.h"

namespace md = muse_decode;
using md::DType;
using md::support::GraphTiming;
using md::support::kCopyBandwidth;
using md::support::time_calls;

namespace {

constexpr int kOut = md::kOProjOutWidth;
constexpr int64_t kRotationBytes = int64_t{320} << 20;

#define CUBLAS_CHECK_OR_EXIT(expr)                                                          \
  do {                                                                                      \
    const cublasStatus_t st_ = (expr);                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, st_); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Random bf16 in [-scale, scale) from a hash of the index (no host copy of
// 320 MB of weights).
__global__ void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xD6E8FEB86659FD93ull;
    z ^= z >> 32;
    const float u = static_cast<float>(z & 0xFFFFFF) * (2.0f / 16777216.0f) - 1.0f;
    const uint32_t bits = __float_as_uint(u * scale);
    p[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

struct Row {
  const char* shape;
  int tp, K, T, pdl;
  double us, us_min, floor_us, bar_us, pct, cublas_us;
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
    std::printf("bench_o_proj: no supported GPU (%s)\n", md::describe_device().c_str());
    return 0;
  }
  std::printf("# %s\n", md::describe_device().c_str());
  md::prepare_o_proj();
  cudaStream_t stream;
  CUDA_CHECK_OR_EXIT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  CUBLAS_CHECK_OR_EXIT(cublasCreate(&cublas));
  CUBLAS_CHECK_OR_EXIT(cublasSetStream(cublas, stream));
  // A workspace of its own, so that capture allocates nothing.
  void* cublas_ws = nullptr;
  const size_t cublas_ws_bytes = size_t{32} << 20;
  CUDA_CHECK_OR_EXIT(cudaMalloc(&cublas_ws, cublas_ws_bytes));
  CUBLAS_CHECK_OR_EXIT(cublasSetWorkspace(cublas, cublas_ws, cublas_ws_bytes));
  const int sms = md::sm_count();
  std::vector<Row> rows;
  std::vector<std::string> anchors;

  for (const int kvh : {2, 16}) {
    const int K = md::o_proj_in_width(kvh);
    const int tp = 16 / kvh;
    const char* shape = kvh == 2 ? "TP8" : "TP1";
    const int64_t wbytes = int64_t{kOut} * K * 2;
    const int copies = static_cast<int>(std::max<int64_t>(3, (kRotationBytes + wbytes - 1) / wbytes));
    const int calls = kvh == 2 ? 64 : 12;
    // The bars: 1.15x the weight-read floor at TP8, 1.10x at TP1.
    const double floor_us = wbytes / kCopyBandwidth * 1e6;
    const double bar_us = (kvh == 2 ? 1.15 : 1.10) * floor_us;

    uint16_t *w, *x, *out;
    CUDA_CHECK_OR_EXIT(cudaMalloc(&w, wbytes * copies));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&x, int64_t{md::kOProjMaxTokens} * K * 2));
    CUDA_CHECK_OR_EXIT(cudaMalloc(&out, int64_t{md::kOProjMaxTokens} * kOut * 2));
    fill_random_bf16<<<4 * sms, 256>>>(w, static_cast<size_t>(wbytes / 2) * copies, 1234 + kvh, 0.03f);
    fill_random_bf16<<<sms, 256>>>(x, static_cast<size_t>(md::kOProjMaxTokens) * K, 99, 1.0f);
    CUDA_CHECK_OR_EXIT(cudaGetLastError());
    CUDA_CHECK_OR_EXIT(cudaDeviceSynchronize());
    const auto weight = [&](int i) { return w + static_cast<size_t>(i % copies) * (wbytes / 2); };

    const auto call = [&](int T, int i, int pdl) {
      md::OProjArgs a;
      a.x = md::make_tensor(x, DType::kBFloat16, {T, K});
      a.weight = md::make_tensor(weight(i), DType::kBFloat16, {kOut, K});
      a.out = md::make_tensor(out, DType::kBFloat16, {T, kOut});
      a.pdl = pdl != 0;
      md::o_proj(a, reinterpret_cast<md::Stream>(stream));
    };
    // out [T, 8192] = x [T, K] W^T: column-major, out^T = W^T(op T of the [K, 8192] view) x^T.
    const auto gemm = [&](int T, int i) {
      const float one = 1.0f, zero = 0.0f;
      CUBLAS_CHECK_OR_EXIT(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, kOut, T, K, &one, weight(i), CUDA_R_16BF, K,
                                        x, CUDA_R_16BF, K, &zero, out, CUDA_R_16BF, kOut, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    };
    constexpr int kTokenCounts[] = {1, 4, 8, 16, 32, 64};
    // One eager call of each before any capture (kernel selection, tensor maps).
    for (const int T : kTokenCounts) {
      call(T, 0, 0);
      gemm(T, 0);
    }
    CUDA_CHECK_OR_EXIT(cudaStreamSynchronize(stream));

    for (const int T : kTokenCounts) {
      if (quick && T != 8 && T != 64) continue;
      const GraphTiming cb = time_calls(stream, calls, [&](int i) { gemm(T, i); });
      for (const int pdl : {1, 0}) {
        const GraphTiming tm = time_calls(stream, calls, [&](int i) { call(T, i, pdl); });
        const int64_t bytes = wbytes + int64_t{T} * K * 2 + int64_t{T} * kOut * 2;
        rows.push_back(Row{shape, tp, K, T, pdl, tm.median_us, tm.min_us, floor_us, bar_us,
                           100.0 * bytes / (tm.median_us * 1e-6) / kCopyBandwidth, cb.median_us, bytes});
        const Row& r = rows.back();
        std::printf("%s T=%2d pdl=%d: %7.2f us (floor %.2f, %.3fx, %.1f%% of copy bandwidth), cuBLAS %.2f us\n",
                    shape, T, pdl, r.us, floor_us, r.us / floor_us, r.pct, cb.median_us);
      }
    }

    // Copy anchor: copy i reads copy i and writes copy i + 1 (the rotation keeps it out of L2).
    {
      const int copy_calls = copies - 1;
      const GraphTiming cp = time_calls(stream, copy_calls, [&](int i) {
        CUDA_CHECK_OR_EXIT(cudaMemcpyAsync(weight(i + 1), weight(i), wbytes, cudaMemcpyDeviceToDevice, stream));
      });
      char line[256];
      std::snprintf(line, sizeof line,
                    "{\"op\": \"anchor_memcpy\", \"shape\": \"%s\", \"bytes_moved\": %lld, \"us_per_call\": %.3f, "
                    "\"tb_per_s\": %.3f}",
                    shape, static_cast<long long>(2 * wbytes), cp.median_us, 2 * wbytes / cp.median_us * 1e-6);
      anchors.push_back(line);
    }
    CUDA_CHECK_OR_EXIT(cudaFree(w));
    CUDA_CHECK_OR_EXIT(cudaFree(x));
    CUDA_CHECK_OR_EXIT(cudaFree(out));
  }

  std::printf("\n%-5s %3s %4s %9s %9s %8s %7s %7s %10s %8s %s\n", "shape", "T", "pdl", "us/call", "floor_us", "bar_us",
              "x_flr", "%copy", "cublas_us", "x_cublas", "bar");
  for (const Row& r : rows)
    std::printf("%-5s %3d %4d %9.2f %9.2f %8.2f %7.3f %7.1f %10.2f %8.2f %s\n", r.shape, r.T, r.pdl, r.us, r.floor_us,
                r.bar_us, r.us / r.floor_us, r.pct, r.cublas_us, r.cublas_us / r.us, r.us <= r.bar_us ? "ok" : "MISS");
  for (const auto& a : anchors) std::printf("%s\n", a.c_str());

  if (json_path) {
    FILE* json = std::fopen(json_path, "w");
    if (!json) {
      std::fprintf(stderr, "bench_o_proj: cannot write %s\n", json_path);
      return 1;
    }
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    std::fprintf(json,
                 "{\n \"benchmark\": \"o_proj\",\n \"device\": \"%s\",\n \"date\": \"%s\",\n \"method\": \"CUDA-graph "
                 "replay, %s calls per graph, weight copies rotated over >= 320 MiB, median of 7 replays; cuBLAS "
                 "(cublasGemmEx bf16, fp32 accumulation) on the same shapes and copies in the same run\",\n \"rows\": [\n",
                 md::describe_device().c_str(), date, "64 (TP8) / 12 (TP1)");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(json,
                   "  {\"op\": \"o_proj\", \"tp\": %d, \"k\": %d, \"tokens\": %d, \"pdl\": %d, \"us_per_call\": %.3f, "
                   "\"us_per_call_min\": %.3f, \"bytes\": %lld, \"floor_us\": %.3f, \"bar_us\": %.3f, \"x_floor\": %.3f, "
                   "\"tb_per_s\": %.3f, \"pct_copy_bw\": %.1f, \"cublas_us\": %.3f, \"speedup_vs_cublas\": %.2f, "
                   "\"meets_bar\": %s}%s\n",
                   r.tp, r.K, r.T, r.pdl, r.us, r.us_min, static_cast<long long>(r.bytes), r.floor_us, r.bar_us,
                   r.us / r.floor_us, r.bytes / r.us * 1e-6, r.pct, r.cublas_us, r.cublas_us / r.us,
                   r.us <= r.bar_us ? "true" : "false", i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(json, " ],\n \"anchors\": [\n");
    for (size_t i = 0; i < anchors.size(); ++i)
      std::fprintf(json, "  %s%s\n", anchors[i].c_str(), i + 1 < anchors.size() ? "," : "");
    std::fprintf(json, " ]\n}\n");
    std::fclose(json);
  }
  CUBLAS_CHECK_OR_EXIT(cublasDestroy(cublas));
  CUDA_CHECK_OR_EXIT(cudaFree(cublas_ws));
  CUDA_CHECK_OR_EXIT(cudaStreamDestroy(stream));
  return 0;
}
