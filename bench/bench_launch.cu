// Host cost of one kernel launch on this machine, the part of every eager
// call that no binding can remove (the bar: at most 5 us per op): a
// loop of launches of an empty kernel in the forms the ops use (triple
// chevrons; cudaLaunchKernelEx with programmatic dependent launch, with a
// cluster attribute, with both; a kernel whose cluster shape is compiled in),
// route's unchecked launch of its params, and each op's whole C++ call
// (checks, then the launch: what the Python binding adds is the rest of its
// host time). Host microseconds per launch, best of 20 loops of 400 launches;
// the GPU finishes each loop before the next starts, so the launch queue never
// fills and the host never waits.
//
//   bench_launch [--json path]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "graph_timing.h"
#include "route/params.h"
#include "muse_decode/attn2.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/route.h"

namespace {

__global__ void empty_kernel(int) {}
__global__ void __cluster_dims__(8, 1, 1) empty_cluster8_kernel(int) {}

double host_us_per_launch(const std::function<void()>& launch, cudaStream_t s) {
  constexpr int kLaunches = 400, kLoops = 20;
  for (int i = 0; i < 200; ++i) launch();
  CUDA_CHECK_OR_EXIT(cudaStreamSynchronize(s));
  double best = 1e30;
  for (int loop = 0; loop < kLoops; ++loop) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunches; ++i) launch();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / kLaunches);
    CUDA_CHECK_OR_EXIT(cudaStreamSynchronize(s));
  }
  CUDA_CHECK_OR_EXIT(cudaGetLastError());
  return best;
}

cudaError_t launch_ex(void (*kernel)(int), cudaStream_t s, int grid, bool pdl, int cluster) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(256);
  config.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attr;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  cudaStream_t s;
  CUDA_CHECK_OR_EXIT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // The route op's launch: 8 tokens with metadata (the package's default, PDL on).
  namespace md = muse_decode;
  float *logits, *bias, *weights;
  int32_t *ids, *meta;
  CUDA_CHECK_OR_EXIT(cudaMalloc(&logits, 8 * 256 * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&bias, 256 * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&weights, 64 * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&ids, 64 * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&meta, md::metadata_size(128) * 4));
  CUDA_CHECK_OR_EXIT(cudaMemset(logits, 0, 8 * 256 * 4));
  CUDA_CHECK_OR_EXIT(cudaMemset(bias, 0, 256 * 4));
  CUDA_CHECK_OR_EXIT(cudaDeviceSynchronize());
  md::route_impl::Params p;
  p.logits = logits;
  p.logits_stride = 256;
  p.bias = bias;
  p.route_scale = 1.0f;
  p.ids = ids;
  p.weights = weights;
  p.num_tokens = 8;
  p.metadata = meta;
  p.local_expert_offset = 0;
  p.num_local_experts = 32;
  p.tile_n = 128;
  p.pdl = true;

  struct Row {
    const char* form;
    double us;
  };
  std::vector<Row> rows;
  rows.push_back({"empty kernel <<<8, 256>>>", host_us_per_launch([&] { empty_kernel<<<8, 256, 0, s>>>(0); }, s)});
  rows.push_back({"cudaLaunchKernelEx, no attribute",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(launch_ex(empty_kernel, s, 8, false, 0)); }, s)});
  rows.push_back({"cudaLaunchKernelEx, PDL",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(launch_ex(empty_kernel, s, 8, true, 0)); }, s)});
  rows.push_back({"cudaLaunchKernelEx, cluster 8",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(launch_ex(empty_kernel, s, 8, false, 8)); }, s)});
  rows.push_back({"cudaLaunchKernelEx, cluster 8 + PDL",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(launch_ex(empty_kernel, s, 8, true, 8)); }, s)});
  rows.push_back({"__cluster_dims__(8) kernel, cudaLaunchKernelEx + PDL",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(launch_ex(empty_cluster8_kernel, s, 8, true, 0)); }, s)});
  const auto st = reinterpret_cast<md::Stream>(s);
  rows.push_back({"route's unchecked launch (b = 8, metadata, PDL): route_impl::launch(Params)",
                  host_us_per_launch([&] { CUDA_CHECK_OR_EXIT(cudaError_t(md::route_impl::launch(p, st))); }, s)});
  md::prepare_route();
  md::RouteArgs ra;
  ra.logits = md::make_tensor(logits, md::DType::kFloat32, {8, 256});
  ra.expert_bias = md::make_tensor(bias, md::DType::kFloat32, {256});
  ra.ids = md::make_tensor(ids, md::DType::kInt32, {8, 8});
  ra.weights = md::make_tensor(weights, md::DType::kFloat32, {8, 8});
  ra.metadata = md::RoutingMetadata{md::make_tensor(meta, md::DType::kInt32, {md::metadata_size(128)}), 0, 32, 128};
  rows.push_back({"route() C++ call (b = 8, metadata, PDL)", host_us_per_launch([&] { md::route(ra, st); }, s)});

  // The whole C++ calls: TP8 shapes, 8 tokens, PDL (as the package calls them).
  const int kvh = 2, heads = 16, n = md::qkv_width(kvh), L = 2048, pages = L / 16;
  uint16_t *x, *w, *qkv, *cache, *attn_out;
  int64_t *pos, *slots;
  int32_t *table, *lens;
  uint8_t* front_ws;
  const int64_t front_ws_bytes = md::qkv_front_workspace_bytes_for_device(kvh);
  CUDA_CHECK_OR_EXIT(cudaMalloc(&x, 8 * 8192 * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&w, size_t(n) * 8192 * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&qkv, 8 * n * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&cache, size_t(pages) * kvh * 16 * 128 * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&attn_out, 8 * heads * 64 * 2));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&pos, 8 * 8));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&slots, 8 * 8));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&table, pages * 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&lens, 4));
  CUDA_CHECK_OR_EXIT(cudaMalloc(&front_ws, front_ws_bytes));
  CUDA_CHECK_OR_EXIT(cudaMemset(x, 0, 8 * 8192 * 2));
  CUDA_CHECK_OR_EXIT(cudaMemset(w, 0, size_t(n) * 8192 * 2));
  CUDA_CHECK_OR_EXIT(cudaMemset(cache, 0, size_t(pages) * kvh * 16 * 128 * 2));
  CUDA_CHECK_OR_EXIT(cudaMemset(pos, 0, 64));
  CUDA_CHECK_OR_EXIT(cudaMemset(slots, 0xFF, 64));  // -1: no cache insert
  CUDA_CHECK_OR_EXIT(cudaMemset(table, 0, pages * 4));
  const int32_t h_len = L;
  CUDA_CHECK_OR_EXIT(cudaMemcpy(lens, &h_len, 4, cudaMemcpyHostToDevice));
  CUDA_CHECK_OR_EXIT(cudaMemset(front_ws, 0, front_ws_bytes));
  CUDA_CHECK_OR_EXIT(cudaDeviceSynchronize());
  md::prepare_qkv_front();
  md::prepare_attn2();
  const md::TensorRef tx = md::make_tensor(x, md::DType::kBFloat16, {8, 8192}),
                      tw = md::make_tensor(w, md::DType::kBFloat16, {n, 8192}),
                      tpos = md::make_tensor(pos, md::DType::kInt64, {8}),
                      tslots = md::make_tensor(slots, md::DType::kInt64, {8}),
                      tcache = md::make_tensor(cache, md::DType::kBFloat16, {pages, kvh, 16, 128}),
                      tqkv = md::make_tensor(qkv, md::DType::kBFloat16, {8, n}),
                      tws = md::make_tensor(front_ws, md::DType::kUInt8, {front_ws_bytes});
  md::QkvFrontArgs f;  // NoPE: no cos_sin
  f.x = tx;
  f.weight = tw;
  f.positions = tpos;
  f.slot_mapping = tslots;
  f.kv_cache = tcache;
  f.num_kv_heads = kvh;
  f.out = tqkv;
  f.workspace = tws;
  rows.push_back({"qkv_front() C++ call (TP8, T = 8, NoPE, PDL)", host_us_per_launch([&] { md::qkv_front(f, st); }, s)});
  md::Attn2Args a;
  a.q = md::make_tensor(qkv, md::DType::kBFloat16, {8, heads * 64});
  a.q.stride[0] = n;
  a.gate = a.q;
  a.gate.data = qkv + (heads + 2 * kvh) * 64;
  a.kv_cache = tcache;
  a.block_table = md::make_tensor(table, md::DType::kInt32, {1, pages});
  a.seq_lens = md::make_tensor(lens, md::DType::kInt32, {1});
  a.out = md::make_tensor(attn_out, md::DType::kBFloat16, {8, heads * 64});
  a.max_model_len = L;
  a.num_splits = 1;
  rows.push_back({"attn2() C++ call (TP8, L = 2048, PDL)", host_us_per_launch([&] { md::attn2(a, st); }, s)});

  std::printf("host us per launch (best of 20 loops of 400)\n");
  for (const auto& r : rows) std::printf("  %-55s %6.2f\n", r.form, r.us);
  if (json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (!f) return 1;
    for (const auto& r : rows) std::fprintf(f, "{\"op\": \"launch\", \"form\": \"%s\", \"host_us\": %.3f}\n", r.form, r.us);
    std::fclose(f);
  }
  cudaFree(logits);
  cudaFree(bias);
  cudaFree(weights);
  cudaFree(ids);
  cudaFree(meta);
  for (void* ptr : {(void*)x, (void*)w, (void*)qkv, (void*)cache, (void*)attn_out, (void*)pos, (void*)slots,
                    (void*)table, (void*)lens, (void*)front_ws})
    cudaFree(ptr);
  cudaStreamDestroy(s);
  return 0;
}
