// attn2 benchmark: CUDA-graph replay of many calls per graph, each captured
// call reading a different copy of the KV pages (block tables into disjoint
// page ranges of one cache, together past 3x the 60 MB L2), median of 7
// replays. One JSON line per shape (also to --json PATH), then a table.
//
// Bytes moved per call: the visible keys' K and V (L * KVH * 256 bytes per
// request; W + 7 keys with a window) plus q, gate and out. floor_us = bytes /
// 4.2 TB/s (the measured copy bandwidth, SPEC section 9).
//
//   bench_attn2 [--json PATH] [--quick] [--only INDEX[,INDEX...]] [--splits N] [--cluster 8|16] [--len L] [--shuffle] [--rotate-mb M] [--cache-per-call] [--scrub]
// (--splits: every shape with that many slices instead of attn2_splits'; --cluster:
// CTAs per slice on every path; --len: every shape at that length (at most its
// max_model_len); all three experiments)
#include <cuda_runtime.h>

#include "graph_timing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/attn2.h"
#include "muse_decode/constants.h"

namespace md = muse_decode;


namespace {

using md::timing::kCopyBandwidth;
int64_t g_rotate_bytes = 3LL * 60 * 1000 * 1000;  // 3x the L2 (--rotate-mb M: M MB)

__global__ void fill_random_bf16(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    // Uniform in [-1, 1): sign, exponent 126 or below, random mantissa.
    const uint32_t exp = 121u + (h >> 29);  // 2^-6 .. 2^-0.x
    p[i] = static_cast<uint16_t>(((h & 1u) << 15) | (std::min(exp, 126u) << 7) | ((h >> 8) & 0x7Fu));
  }
}

struct Shape {
  const char* name;
  int kvh, reqs, mml, sliding, len;
};

struct Result {
  Shape s;
  int window, splits, calls;
  double us, us_pdl, bytes, floor_us, bar_us;
  const char* bar;
  bool ok;
};

int g_cluster_override = 0;  // --cluster N
bool g_shuffle = false;      // --shuffle: each run's pages in a random order (as bench_attn2.py)
constexpr size_t kScrubBytes = size_t{256} << 20;
void* g_scrub = nullptr;     // --scrub: kScrubBytes written before each timed replay (as bench/harness.py's L2 scrub)
bool g_cache_per_call = false;  // --cache-per-call: each call its own cache tensor, one table (as bench_attn2.py)

}  // namespace
// The trace ring of attn2's kernel, defined only in a build with
// -DMUSE_DECODE_TRACE=1 (src/common/trace.cuh).
extern "C" int muse_decode_dump_attn2_trace(const char* path) __attribute__((weak));
namespace {

double time_graph(const md::Attn2Args& base, const std::vector<md::Attn2Args>& calls, bool pdl, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK_OR_EXIT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (md::Attn2Args a : calls) {
    a.pdl = pdl;
    if (g_cluster_override) {  // an experiment: the split path with another cluster size
      md::Attn2Params prm = md::check_attn2(a);
      prm.cluster_size = g_cluster_override;
      if (md::launch(prm, reinterpret_cast<md::Stream>(stream))) std::abort();
    } else {
      md::attn2(a, reinterpret_cast<md::Stream>(stream));
    }
  }
  CUDA_CHECK_OR_EXIT(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK_OR_EXIT(cudaGraphInstantiate(&exec, graph, 0));
  const double us = md::timing::time_graph(exec, stream, static_cast<int>(calls.size()), 7, [](cudaStream_t st) {
                      if (g_scrub) md::timing::cuda_ok(cudaMemsetAsync(g_scrub, 1, kScrubBytes, st), "scrub");
                    }).median_us;
  CUDA_CHECK_OR_EXIT(cudaGraphExecDestroy(exec));
  CUDA_CHECK_OR_EXIT(cudaGraphDestroy(graph));
  (void)base;
  return us;
}

Result run_shape(const Shape& s, cudaStream_t stream, int splits_override) {
  Result r{};
  r.s = s;
  r.window = md::attn2_window(s.sliding > 0 ? std::optional<int>(s.sliding) : std::nullopt, s.mml);
  r.splits = splits_override > 0 ? splits_override : md::attn2_splits(s.mml, r.window, s.kvh);
  const int L = s.len;
  const int lo = r.window > 0 ? std::max(0, L - 7 - r.window) : 0;
  const int first_page = lo / 16, last_page = (L - 1) / 16;
  const int64_t vis_pages = last_page - first_page + 1;  // pages each (request, KV head) reads
  const int64_t vis_keys = L - lo;
  const int64_t width = 8LL * s.kvh * 64, n = md::qkv_width(s.kvh);
  const double kv_bytes = double(s.reqs) * s.kvh * vis_keys * 256;
  r.bytes = kv_bytes + 3.0 * s.reqs * 8 * width * 2;  // + q, gate, out
  r.floor_us = r.bytes / kCopyBandwidth * 1e6;
  const bool tp1 = s.kvh == 16;
  r.bar_us = tp1 ? r.floor_us / 0.8 : 1.25 * r.floor_us + 3.0;
  r.bar = tp1 ? ">= 80% of 4.2 TB/s" : "<= 1.25 x floor + 3 us";

  // Copies of the pages read per call, together past 3x the L2.
  const int64_t page_bytes_per_call = int64_t(s.reqs) * vis_pages * s.kvh * 4096;
  const int copies = static_cast<int>(std::max<int64_t>(1, (g_rotate_bytes + page_bytes_per_call - 1) / page_bytes_per_call));
  r.calls = page_bytes_per_call > (256LL << 20) ? 10 : page_bytes_per_call > (16LL << 20) ? 30 : 60;
  const int64_t pages = copies * int64_t(s.reqs) * vis_pages;
  const int max_pages = (s.mml + 15) / 16;

  uint16_t *cache, *qkv, *out;
  int32_t *tables, *lens;
  void* ws;
  const int64_t cache_elems = pages * s.kvh * 16 * 128;
  CUDA_CHECK_OR_EXIT(cudaMalloc(&cache, cache_elems * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&qkv, int64_t(s.reqs) * 8 * n * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&out, int64_t(s.reqs) * 8 * width * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&tables, int64_t(copies) * s.reqs * max_pages * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&lens, s.reqs * 4));
  const int64_t ws_bytes = std::max<int64_t>(16, md::attn2_workspace_bytes(s.reqs, s.kvh, r.splits));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&ws, ws_bytes));
  CUDA_CHECK_OR_EXIT(cudaMemset(ws, 0, ws_bytes));
  fill_random_bf16<<<1024, 256, 0, stream>>>(cache, cache_elems, 1);
  fill_random_bf16<<<256, 256, 0, stream>>>(qkv, int64_t(s.reqs) * 8 * n, 2);
  CUDA_CHECK_OR_EXIT(cudaGetLastError());
  // Copy c, request r: visible page i -> page (c * reqs + r) * vis_pages + (i - first_page),
  // in reverse order within the run (not sequential addresses); pages below the window: 0 (never read).
  // (--shuffle: a fixed random permutation of the run instead of the reverse order.)
  std::vector<int32_t> host(int64_t(copies) * s.reqs * max_pages, 0);
  std::vector<int32_t> order(vis_pages);
  std::mt19937 rng(static_cast<unsigned>(L + s.kvh));
  for (int c = 0; c < copies; ++c)
    for (int q = 0; q < s.reqs; ++q) {
      for (int64_t i = 0; i < vis_pages; ++i) order[i] = static_cast<int32_t>(vis_pages - 1 - i);
      if (g_shuffle) std::shuffle(order.begin(), order.end(), rng);
      for (int i = first_page; i <= last_page; ++i)
        host[(int64_t(c) * s.reqs + q) * max_pages + i] =
            static_cast<int32_t>((int64_t(c) * s.reqs + q) * vis_pages + order[i - first_page]);
    }
  CUDA_CHECK_OR_EXIT(cudaMemcpy(tables, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lh(s.reqs, L);
  CUDA_CHECK_OR_EXIT(cudaMemcpy(lens, lh.data(), s.reqs * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK_OR_EXIT(cudaDeviceSynchronize());  // the uploads and memsets before the non-blocking stream

  md::Attn2Args base;
  auto rows = [&](void* data, int64_t stride) {
    md::TensorRef t = md::make_tensor(data, md::DType::kBFloat16, {s.reqs * 8LL, width});
    t.stride[0] = stride;
    return t;
  };
  base.q = rows(qkv, n);
  base.gate = rows(qkv + width + 2LL * s.kvh * 64, n);
  base.out = rows(out, width);
  base.kv_cache = md::make_tensor(cache, md::DType::kBFloat16, {pages, s.kvh, 16, 128});
  base.seq_lens = md::make_tensor(lens, md::DType::kInt32, {s.reqs});
  base.workspace = md::make_tensor(ws, md::DType::kInt32, {ws_bytes / 4});
  base.max_model_len = s.mml;
  base.window = r.window;
  base.num_splits = r.splits;
  std::vector<md::Attn2Args> calls;
  for (int k = 0; k < r.calls; ++k) {
    md::Attn2Args a = base;
    const int c = k % copies;
    if (g_cache_per_call) {  // copy c as a cache of its own (its own tensor map), copy 0's table rebased to it
      const int64_t copy_pages = int64_t(s.reqs) * vis_pages;
      a.kv_cache = md::make_tensor(cache + c * copy_pages * s.kvh * 16 * 128, md::DType::kBFloat16,
                                   {copy_pages, s.kvh, 16, 128});
      a.block_table = md::make_tensor(tables, md::DType::kInt32, {s.reqs, max_pages});
    } else {
      a.block_table = md::make_tensor(tables + int64_t(c) * s.reqs * max_pages, md::DType::kInt32,
                                      {s.reqs, max_pages});
    }
    calls.push_back(a);
  }
  r.us = time_graph(base, calls, false, stream);
  r.us_pdl = time_graph(base, calls, true, stream);
  // Sanity: the output is finite.
  std::vector<uint16_t> o(int64_t(s.reqs) * 8 * width);
  CUDA_CHECK_OR_EXIT(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
  r.ok = std::all_of(o.begin(), o.end(), [](uint16_t b) { return (b & 0x7F80u) != 0x7F80u; });
  CUDA_CHECK_OR_EXIT(cudaFree(cache));
  CUDA_CHECK_OR_EXIT(cudaFree(qkv));
  CUDA_CHECK_OR_EXIT(cudaFree(out));
  CUDA_CHECK_OR_EXIT(cudaFree(tables));
  CUDA_CHECK_OR_EXIT(cudaFree(lens));
  CUDA_CHECK_OR_EXIT(cudaFree(ws));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  bool quick = false;
  std::vector<int> only;
  int splits_override = 0, len_override = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      for (const char* c = argv[++i]; *c;) {
        only.push_back(std::atoi(c));
        while (*c && *c != ',') ++c;
        if (*c == ',') ++c;
      }
    } else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc) splits_override = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cluster") && i + 1 < argc) g_cluster_override = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--len") && i + 1 < argc) len_override = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--shuffle")) g_shuffle = true;
    else if (!std::strcmp(argv[i], "--cache-per-call")) g_cache_per_call = true;
    else if (!std::strcmp(argv[i], "--scrub")) CUDA_CHECK_OR_EXIT(cudaMalloc(&g_scrub, kScrubBytes));
    else if (!std::strcmp(argv[i], "--rotate-mb") && i + 1 < argc) g_rotate_bytes = std::atoll(argv[++i]) * 1000000LL;
  }
  if (!md::supported_family(md::gpu_family())) {
    std::printf("bench_attn2: no supported GPU (%s)\n", md::describe_device().c_str());
    return 0;
  }
  std::printf("# %s\n", md::describe_device().c_str());
  md::prepare_attn2();
  const md::Attn2Residency res = md::attn2_residency();
  std::printf("# one-slice clusters of %d CTAs; co-resident: %d clusters of 8 (%d CTAs), %d clusters of 16 (%d CTAs)\n",
              res.short_cluster_size, res.resident_ctas_8 / 8, res.resident_ctas_8, res.resident_ctas_16 / 16,
              res.resident_ctas_16);
  cudaStream_t stream;
  CUDA_CHECK_OR_EXIT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<Shape> shapes = {
      {"tp8", 2, 1, 131072, 0, 2048},     {"tp8", 2, 1, 131072, 0, 8192},
      {"tp8", 2, 1, 131072, 0, 32768},    {"tp8", 2, 1, 131072, 0, 131072},
      {"tp8_swa", 2, 1, 131072, 2048, 131072},
      {"tp8_short", 2, 1, 2048, 0, 2048},
      {"tp1x8", 16, 8, 131072, 0, 8192},  {"tp1x8", 16, 8, 131072, 0, 32768},
      {"tp1x8", 16, 8, 131072, 0, 131072},
  };
  if (quick) shapes.resize(5);
  if (!only.empty()) {
    std::vector<Shape> picked;
    for (int i : only)
      if (i >= 0 && i < static_cast<int>(shapes.size())) picked.push_back(shapes[i]);
    shapes = picked;
  }
  for (Shape& s : shapes)  // --len: an experiment, e.g. a length whose tiles split evenly over the warpgroups
    if (len_override > 0) s.len = std::min(len_override, s.mml);
  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  std::vector<Result> results;
  for (const Shape& s : shapes) {
    const Result r = run_shape(s, stream, splits_override);
    results.push_back(r);
    if (muse_decode_dump_attn2_trace && std::getenv("MUSE_DECODE_TRACE_DIR")) {
      const std::string path = std::string(std::getenv("MUSE_DECODE_TRACE_DIR")) + "/trace_" + s.name + "_" +
                               std::to_string(s.len) + ".bin";
      muse_decode_dump_attn2_trace(path.c_str());
    }
    char line[1024];
    std::snprintf(line, sizeof line,
                  "{\"op\": \"attn2\", \"shape\": \"%s\", \"num_kv_heads\": %d, \"num_reqs\": %d, "
                  "\"max_model_len\": %d, \"window\": %d, \"seq_len\": %d, \"num_splits\": %d, "
                  "\"calls_per_graph\": %d, \"us_per_call\": %.3f, \"us_per_call_pdl\": %.3f, \"bytes\": %.0f, "
                  "\"floor_us\": %.3f, \"gb_per_s\": %.1f, \"pct_of_copy_bw\": %.1f, \"bar_us\": %.3f, "
                  "\"bar\": \"%s\", \"meets_bar\": %s, \"output_finite\": %s}",
                  s.name, s.kvh, s.reqs, s.mml, r.window, s.len, r.splits, r.calls, r.us, r.us_pdl, r.bytes,
                  r.floor_us, r.bytes / r.us_pdl * 1e-3, 100.0 * r.floor_us / r.us_pdl, r.bar_us, r.bar,
                  r.us_pdl <= r.bar_us ? "true" : "false", r.ok ? "true" : "false");
    std::printf("%s\n", line);
    if (json) std::fprintf(json, "%s\n", line);
  }
  if (json) std::fclose(json);
  // %bw, GB/s and the verdict from the PDL time (the launch's default, as bench_attn2.py judges it).
  std::printf("\n%-10s %4s %3s %7s %5s %7s %6s %9s %9s %8s %8s %6s %8s %s\n", "shape", "KVH", "R", "mml", "W", "L",
              "splits", "us/call", "us(pdl)", "floor", "bar", "%bw", "GB/s", "bar met");
  for (const Result& r : results)
    std::printf("%-10s %4d %3d %7d %5d %7d %6d %9.2f %9.2f %8.2f %8.2f %5.1f%% %8.0f %s\n", r.s.name, r.s.kvh,
                r.s.reqs, r.s.mml, r.window, r.s.len, r.splits, r.us, r.us_pdl, r.floor_us, r.bar_us,
                100.0 * r.floor_us / r.us_pdl, r.bytes / r.us_pdl * 1e-3, r.us_pdl <= r.bar_us ? "yes" : "NO");
  return 0;
}
