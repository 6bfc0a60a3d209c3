// muse-decode: the main job. Runs the Muse Spark verify step's kernels on
// this GPU with random inputs, checks them against the CPU reference and
// prints how fast they are; without a supported GPU it checks the CPU
// reference path on a small shape and says why the GPU part did not run.
//
// Today it covers route (MoE routing + metadata); attn2 and qkv_front join
// it as they land.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef MUSE_DECODE_WITH_CUDA
#include <cuda_runtime.h>

#include "bench_util.h"
#endif

#include "muse_decode/arch.h"
#include "muse_decode/constants.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"

namespace md = muse_decode;

namespace {


struct Options {
  int tp = 8;
  int tokens = 8;
  int tile_n = 128;
  int calls = 256;
  int replays = 7;
  bool json = false;
  bool cpu_only = false;
};

const char* kHelp = R"(usage: muse-decode [options]

Runs the Muse Spark verify step's fused kernels on this GPU with random
weights and inputs, checks every output against the CPU reference, and prints
a table of time per call, bandwidth and floor. Without an SM90/SM100 GPU it
runs the CPU reference path on a small shape and says why.

options:
  --tp N         tensor/expert-parallel size of the deployment: 1, 2, 4 or 8
                 (this rank routes to 256/N local experts; default 8)
  --tokens N     tokens routed per call, 1..8 (default 8: one verify step)
  --tile-n N     GEMM tile of the routing metadata: 8, 16, 32, 64, 128, 256
                 (default 128)
  --calls N      calls per CUDA graph when timing, 16..4096 (default 256)
  --replays N    timed graph replays, the median is reported, 5..101 (default 7)
  --cpu          run only the CPU reference path, even with a GPU
  --json         print the results as one JSON object instead of a table
  -h, --help     this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "muse-decode: %s\n(see muse-decode --help)\n", msg.c_str());
  std::exit(2);
}

int int_flag(int argc, char** argv, int& i, const char* name, int lo, int hi) {
  if (i + 1 >= argc) usage_error(std::string(name) + " needs a value");
  char* end = nullptr;
  const long v = std::strtol(argv[++i], &end, 10);
  if (*end != '\0' || v < lo || v > hi)
    usage_error(std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + argv[i] + "'");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (a == "--tp") {
      o.tp = int_flag(argc, argv, i, "--tp", 1, 8);
      if (o.tp != 1 && o.tp != 2 && o.tp != 4 && o.tp != 8) usage_error("--tp must be 1, 2, 4 or 8, got " + std::to_string(o.tp));
    } else if (a == "--tokens") {
      o.tokens = int_flag(argc, argv, i, "--tokens", 1, md::kRouteMaxTokens);
    } else if (a == "--tile-n") {
      o.tile_n = int_flag(argc, argv, i, "--tile-n", 8, 256);
      if (!md::valid_tile_n(o.tile_n)) usage_error("--tile-n must be one of 8, 16, 32, 64, 128, 256, got " + std::to_string(o.tile_n));
    } else if (a == "--calls") {
      o.calls = int_flag(argc, argv, i, "--calls", 16, 4096);
    } else if (a == "--replays") {
      o.replays = int_flag(argc, argv, i, "--replays", 5, 101);
    } else if (a == "--cpu") {
      o.cpu_only = true;
    } else if (a == "--json") {
      o.json = true;
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  return o;
}

struct RouteInputs {
  std::vector<float> logits, bias;
};

RouteInputs random_route_inputs(int rows, std::mt19937& rng) {
  RouteInputs in;
  std::normal_distribution<float> n(0.0f, 2.0f), nb(0.0f, 0.02f);
  in.logits.resize(static_cast<size_t>(rows) * md::kNumExperts);
  for (auto& v : in.logits) v = n(rng);
  in.bias.resize(md::kNumExperts);
  for (auto& v : in.bias) v = nb(rng);
  return in;
}

// The CPU path: the reference on a small shape, checked against the formula
// in double precision (selection and weights) and the metadata invariants.
bool cpu_check(const Options& o, std::string* detail) {
  std::mt19937 rng(42);
  const int rows = 64;
  RouteInputs in = random_route_inputs(rows, rng);
  std::vector<int32_t> ids(rows * 8);
  std::vector<float> w(rows * 8);
  md::reference::route(in.logits.data(), rows, in.bias.data(), 1.0f, ids.data(), w.data());
  int bad = 0;
  for (int t = 0; t < rows; ++t) {
    double s[256], key[256];
    for (int e = 0; e < 256; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(in.logits[t * 256 + e])));
      key[e] = s[e] + in.bias[e];
    }
    double sum = 0.0, last = 1e300;
    for (int k = 0; k < 8; ++k) sum += s[ids[t * 8 + k]];
    for (int k = 0; k < 8; ++k) {
      const int id = ids[t * 8 + k];
      if (key[id] > last) ++bad;  // slots in descending key order
      last = key[id];
      if (std::fabs(w[t * 8 + k] - s[id] / sum) > 1e-6) ++bad;
    }
    int larger = 0;  // no expert outside the 8 has a key above the 8th
    for (int e = 0; e < 256; ++e)
      if (key[e] > last + 1e-6 && std::find(&ids[t * 8], &ids[t * 8 + 8], e) == &ids[t * 8 + 8]) ++larger;
    bad += larger;
  }
  const int local = md::kNumExperts / o.tp;
  std::vector<int32_t> meta(md::metadata_size(o.tile_n), 0x7eadbeef);
  md::reference::routing_metadata(ids.data(), o.tokens, 0, local, o.tile_n, meta.data());
  int routed = 0;
  for (int r = 0; r < o.tokens * 8; ++r) {
    const int p = meta[md::kMetaExpandedToPermuted + r];
    if (ids[r] < local) {
      ++routed;
      if (p < 0 || meta[md::kMetaPermutedToToken + p] != r / 8) ++bad;
    } else if (p != -1) {
      ++bad;
    }
  }
  if (meta[md::kMetaPaddedTokens] < routed) ++bad;
  *detail = std::to_string(rows) + " rows routed, " + std::to_string(routed) + " local routes in the metadata";
  return bad == 0;
}

#ifdef MUSE_DECODE_WITH_CUDA
#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

struct GpuResult {
  bool pass = false;
  std::string detail;
  double us_per_call = 0, us_per_call_hot = 0;
};

GpuResult gpu_route(const Options& o) {
  GpuResult r;
  const int b = o.tokens, local = md::kNumExperts / o.tp, calls = o.calls;
  const int64_t meta_len = (md::metadata_size(o.tile_n) + 3) / 4 * 4;
  std::mt19937 rng(7);
  RouteInputs in = random_route_inputs(calls * b, rng);
  float *logits, *bias, *weights;
  int32_t *ids, *meta;
  char* scrub;
  const size_t scrub_bytes = size_t(256) << 20;
  CUDA_CHECK(cudaMalloc(&logits, in.logits.size() * 4));
  CUDA_CHECK(cudaMalloc(&bias, 256 * 4));
  CUDA_CHECK(cudaMalloc(&ids, size_t(calls) * b * 8 * 4));
  CUDA_CHECK(cudaMalloc(&weights, size_t(calls) * b * 8 * 4));
  CUDA_CHECK(cudaMalloc(&meta, size_t(calls) * meta_len * 4));
  CUDA_CHECK(cudaMalloc(&scrub, scrub_bytes));
  CUDA_CHECK(cudaMemcpy(logits, in.logits.data(), in.logits.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(bias, in.bias.data(), 256 * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(meta, 0xff, size_t(calls) * meta_len * 4));

  md::RouterDesc router;
  router.expert_bias = md::make_tensor(bias, md::DType::kFloat32, {256});
  const md::MuseRouting routing(router);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto call = [&](int i) {
    md::RoutingMetadata m{md::make_tensor(meta + i * meta_len, md::DType::kInt32, {meta_len}), 0, local, o.tile_n};
    routing(md::make_tensor(logits + size_t(i) * b * 256, md::DType::kFloat32, {b, 256}),
            md::make_tensor(ids + size_t(i) * b * 8, md::DType::kInt32, {b, 8}),
            md::make_tensor(weights + size_t(i) * b * 8, md::DType::kFloat32, {b, 8}), &m,
            reinterpret_cast<md::Stream>(stream));
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) call(i);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));

  // Check every call's output against the CPU reference.
  std::vector<int32_t> g_ids(size_t(calls) * b * 8), g_meta(size_t(calls) * meta_len);
  std::vector<float> g_w(size_t(calls) * b * 8);
  CUDA_CHECK(cudaMemcpy(g_ids.data(), ids, g_ids.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(g_w.data(), weights, g_w.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(g_meta.data(), meta, g_meta.size() * 4, cudaMemcpyDeviceToHost));
  int id_mismatch = 0, w_bad = 0, meta_bad = 0, checked = 0;
  for (int i = 0; i < calls; ++i) {
    std::vector<int32_t> rid(b * 8);
    std::vector<float> rw(b * 8);
    md::reference::route(&in.logits[size_t(i) * b * 256], b, in.bias.data(), 1.0f, rid.data(), rw.data());
    for (int k = 0; k < b * 8; ++k) {
      // The host expf may differ from CUDA's by an ulp: ids can differ only
      // where two keys are that close; weights agree to a few ulp.
      id_mismatch += rid[k] != g_ids[size_t(i) * b * 8 + k];
      w_bad += std::fabs(rw[k] - g_w[size_t(i) * b * 8 + k]) > 1e-6f * std::fabs(rw[k]) + 1e-9f;
    }
    std::vector<int32_t> ref(meta_len, -1);
    std::copy(&g_meta[size_t(i) * meta_len], &g_meta[size_t(i) * meta_len] + meta_len, ref.begin());
    std::vector<int32_t> expect(ref.size(), -1);  // the same poison the buffer had (0xffffffff)
    md::reference::routing_metadata(&g_ids[size_t(i) * b * 8], b, 0, local, o.tile_n, expect.data());
    meta_bad += !std::equal(expect.begin(), expect.begin() + md::metadata_size(o.tile_n), ref.begin());
    checked += b;
  }
  r.pass = w_bad == 0 && meta_bad == 0 && id_mismatch <= checked / 100;
  r.detail = std::to_string(checked) + " rows: " + std::to_string(id_mismatch) + " ids differ from the host-expf reference (near-ties), " +
             std::to_string(w_bad) + " weights off, " + std::to_string(meta_bad) + " metadata buffers differ";

  auto time_graph = [&](bool cold) {
    return md::bench::time_graph(exec, stream, calls, o.replays, [&](cudaStream_t s) {
             if (cold) CUDA_CHECK(cudaMemsetAsync(scrub, 1, scrub_bytes, s));  // flush the L2
           }).median_us;
  };
  r.us_per_call = time_graph(true);
  r.us_per_call_hot = time_graph(false);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  for (void* p : {(void*)logits, (void*)bias, (void*)ids, (void*)weights, (void*)meta, (void*)scrub}) cudaFree(p);
  return r;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const md::GpuFamily family = md::gpu_family();
  const bool gpu = !o.cpu_only && md::supported_family(family);
  std::string cpu_detail;
  const bool cpu_pass = cpu_check(o, &cpu_detail);
  const int local = md::kNumExperts / o.tp;
  if (!gpu) {
    const std::string why = o.cpu_only ? "--cpu was given"
                                       : "the GPU part needs an SM90 (H100/H200) or SM100 (B200/B300) GPU; this machine has: " +
                                             md::describe_device();
    if (o.json) {
      std::printf("{\"mode\": \"cpu\", \"route_reference\": \"%s\", \"detail\": \"%s\", \"gpu_skipped\": \"%s\"}\n",
                  cpu_pass ? "pass" : "FAIL", cpu_detail.c_str(), why.c_str());
    } else {
      std::printf("muse-decode: CPU reference path (TP%d, %d local experts, tile_n %d)\n", o.tp, local, o.tile_n);
      std::printf("  route reference: %s (%s)\n", cpu_pass ? "pass" : "FAIL", cpu_detail.c_str());
      std::printf("  GPU part not run: %s\n", why.c_str());
    }
    return cpu_pass ? 0 : 1;
  }
#ifdef MUSE_DECODE_WITH_CUDA
  try {
    if (!o.json) std::fprintf(stderr, "muse-decode: %s, TP%d, %d tokens: timing route...\n", md::describe_device().c_str(), o.tp, o.tokens);
    const GpuResult r = gpu_route(o);
    const double bytes = o.tokens * 256 * 4 + 256 * 4 + o.tokens * 8 * 8;
    const double floor_us = bytes / md::bench::kCopyBandwidth * 1e6;
    if (o.json) {
      std::printf("{\"mode\": \"gpu\", \"device\": \"%s\", \"tp\": %d, \"tokens\": %d, \"tile_n\": %d, \"route\": {\"check\": \"%s\", "
                  "\"detail\": \"%s\", \"us_per_call\": %.3f, \"us_per_call_l2_hot\": %.3f, \"floor_us\": %.4f, \"bar_us\": 3.0}}\n",
                  md::describe_device().c_str(), o.tp, o.tokens, o.tile_n, r.pass ? "pass" : "FAIL", r.detail.c_str(),
                  r.us_per_call, r.us_per_call_hot, floor_us);
    } else {
      std::printf("muse-decode on %s: TP%d, %d tokens, %d local experts, tile_n %d\n", md::describe_device().c_str(), o.tp,
                  o.tokens, local, o.tile_n);
      std::printf("  %-8s %-6s %12s %12s %10s %8s\n", "op", "check", "us/call", "us (L2 hot)", "floor us", "bar us");
      std::printf("  %-8s %-6s %12.2f %12.2f %10.4f %8.1f\n", "route", r.pass ? "pass" : "FAIL", r.us_per_call,
                  r.us_per_call_hot, floor_us, 3.0);
      std::printf("  route check: %s\n", r.detail.c_str());
      std::printf("  CPU reference path: %s (%s)\n", cpu_pass ? "pass" : "FAIL", cpu_detail.c_str());
    }
    return r.pass && cpu_pass ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muse-decode: %s\n", e.what());
    return 1;
  }
#else
  return 1;
#endif
}
