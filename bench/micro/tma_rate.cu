// The rate at which attn2's page copies stream into shared memory with no
// compute behind them, by copy form, grid, CTAs per SM, ring depth and
// issuing warps.
//
// Every CTA copies tiles of 4 random pages (one KV head of the
// [pages, 2, 16, 128] bf16 cache: 4 KB a page, 16 KB a tile) through a ring of
// shared-memory stages, the consumer releasing each stage as soon as it has
// landed. Copy forms:
//   tma2  two 2 KB tensor boxes per page, K then V (attn2's sm_90a loads),
//   tma1  one 4 KB tensor box per page (K and V of each 8 keys interleaved),
//   bulk  one 4 KB cp.async.bulk per page, contiguous (attn2's sm_100a loads).
// No copy carries an L2 cache hint (attn2's carry an evict-first one). The
// cache is larger than the L2 (random pages over 2 GB, "DRAM") or
// L2-resident (16 MB, "L2").
//
//   cmake --build build --target tma_rate && build/tma_rate
//
// Prints the GPU's SMs and clock, then three tables; each row is the median
// of 7 launches: "us", and the copied bytes' rate in TB/s and in bytes per
// clock and SM ("B/clk/SM", at the reported clock).
// 1. Grids on 112 SMs and on all SMs, 1 or 2 CTAs per SM ("CTA/SM"), 3, 6
//    or 12 stages, one issuing warp, 192 tiles per CTA; each launch timed by
//    events around it.
// 2. As 1 with one CTA per SM and the ring split over W = 1, 2 or 4 issuing
//    warps (warp w takes tiles t = w mod W, on stages of its own): whether a
//    CTA's rate is the limit of its single issuing warp.
// 3. Few SMs from DRAM, one CTA per SM, timed inside the kernel (the first
//    CTA's start to the last CTA's end, %globaltimer): 32 and 64 SMs, 8 and 64
//    tiles per CTA, 1, 2 or 4 issuing warps, 3 to 12 stages. The question:
//    whether attn2 at 8k could take its pages on one slice (2 KV heads x 16
//    CTAs, 8 tiles of 16 KB each; docs/attn2.md, "Grid and slices"): can 32
//    SMs pull those 4 MB from DRAM in well under 2 us with deeper rings?
// Exits non-zero where an allocation, a tensor map or a launch fails.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/ptx.cuh"
#include "common/tensor_map.h"
#include "page_hash.cuh"

namespace ptx = muse_decode::ptx;

// The copies without an L2 cache hint are kept here: the product's
// (ptx::tma_load_5d, ptx::bulk_copy_g2s) take an evict-first policy.
// One box of a 5-D tensor map at (c0, .., c4).
__device__ __forceinline__ void tma_load_5d_no_hint(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                    int c3, int c4, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}
// cp.async.bulk of `bytes` from global memory (kept here for the same reason).
__device__ __forceinline__ void bulk_copy_g2s_no_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

constexpr int kPageBytes = 16 * 256, kTilePages = 4, kTileBytes = kTilePages * kPageBytes, kKvh = 2;

// mode 0 tma2, 1 tma1, 2 bulk
__global__ void stream(const __grid_constant__ CUtensorMap map2, const __grid_constant__ CUtensorMap map1,
                       const char* cache, int pages, int tiles, int stages, int mode, unsigned seed, int issuers,
                       unsigned long long* span) {
  extern __shared__ __align__(1024) uint8_t smem[];
  if (span && threadIdx.x == 0) {
    const unsigned long long t = ptx::globaltimer();
    atomicMin(&span[0], t);
  }
  __shared__ uint64_t full[16];
  const uint32_t base = (ptx::smem_addr(smem) + 1023u) & ~1023u;
  const int kvh = blockIdx.x % kKvh;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) ptx::mbar_init(ptx::smem_addr(&full[s]), 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const int w = threadIdx.x / 32;
  if (w >= issuers) return;
  const int lane = threadIdx.x % 32;
  const int ring = stages / issuers;  // this warp's stages: w * ring ..
  auto stage_of = [&](int t) { return w * ring + (t / issuers) % ring; };
  auto issue = [&](int t) {
    const int s = stage_of(t);
    const uint32_t bar = ptx::smem_addr(&full[s]);
    if (lane == 0) ptx::mbar_arrive_expect_tx(bar, kTileBytes);
    __syncwarp();
    if (lane < kTilePages) {
      const int page = static_cast<int>(hash(seed ^ (blockIdx.x * 7919u + t * 131u + lane)) % static_cast<uint32_t>(pages));
      const uint32_t dst = base + s * kTileBytes + lane * kPageBytes;
      if (mode == 0) {
        for (int h = 0; h < 2; ++h) tma_load_5d_no_hint(dst + h * 2048, &map2, 0, h, 0, kvh, page, bar);
      } else if (mode == 1) {
        tma_load_5d_no_hint(dst, &map1, 0, 0, 0, 0, page * kKvh + kvh, bar);
      } else {
        const char* src = cache + (static_cast<int64_t>(page) * kKvh + kvh) * kPageBytes;
        bulk_copy_g2s_no_hint(dst, src, kPageBytes, bar);
      }
    }
  };
  // Warp w: tiles w, w + W, ...; the k-th of them uses its stage k % ring.
  int k = 0;
  for (int t = w; t < tiles; t += issuers, ++k) {
    if (k >= ring) ptx::mbar_wait(ptx::smem_addr(&full[stage_of(t)]), ((k - ring) / ring) & 1);
    issue(t);
  }
  for (int j = max(0, k - ring); j < k; ++j) ptx::mbar_wait(ptx::smem_addr(&full[w * ring + j % ring]), (j / ring) & 1);
  if (span && lane == 0) {
    const unsigned long long t = ptx::globaltimer();
    atomicMax(&span[1], t);
  }
}

int main() {
  int dev = 0, sms = 0, clk_khz = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, dev);
  const int64_t big_pages = 262144;  // 2 GB
  char* cache = nullptr;
  if (cudaMalloc(&cache, big_pages * kKvh * kPageBytes) != cudaSuccess) return 1;
  cudaMemset(cache, 0, big_pages * kKvh * kPageBytes);
  CUtensorMap map2, map1;
  const auto cache_map = [&](CUtensorMap* map, const cuuint64_t (&dims)[5], const cuuint64_t (&strides)[4],
                             const cuuint32_t (&box)[5]) {
    return muse_decode::tma::encode(map,
                                    muse_decode::tma::bf16_tiled<5>(cache, dims, strides, box,
                                                                    muse_decode::tma::kPagePromotion));
  };
  // (64 elements, K|V, key, KV head, page): 2 KB boxes
  if (!cache_map(&map2, {64, 2, 16, kKvh, static_cast<cuuint64_t>(big_pages)},
                 {128, 256, kPageBytes, static_cast<cuuint64_t>(kKvh) * kPageBytes}, {64, 1, 16, 1, 1}))
    return 2;
  // (64 elements, key in 8, K|V, key group, page x KV head): one 4 KB box
  if (!cache_map(&map1, {64, 8, 2, 2, static_cast<cuuint64_t>(big_pages) * kKvh}, {256, 128, 2048, kPageBytes},
                 {64, 8, 2, 2, 1})) {
    std::printf("tma1 map: encode failed\n");
    return 3;
  }
  cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const char* names[3] = {"tma2", "tma1", "bulk"};
  std::printf("SMs %d, clock %.2f GHz\n", sms, clk_khz / 1e6);
  // One configuration: the median of 7 launches, printed as a row (`col4`:
  // CTAs per SM or issuing warps). False if a launch failed.
  auto measure = [&](int used, int grid, int threads, int smem_req, int pages, int stages, int mode, unsigned seed,
                     int issuers, bool hot, int col4) {
    constexpr int tiles = 192;
    std::vector<float> ts;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0);
      stream<<<grid, threads, smem_req>>>(map2, map1, cache, pages, tiles, stages, mode, seed + r * 77u, issuers, nullptr);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      ts.push_back(ms * 1e3f);
    }
    if (cudaGetLastError() != cudaSuccess) {
      std::printf("launch failed (%s, %d)\n", names[mode], col4);
      return false;
    }
    std::sort(ts.begin(), ts.end());
    const double us = ts[3], bytes = double(grid) * tiles * kTileBytes;
    std::printf("%-5s %-6s %5d %6d %6d %8.2f %8.2f %10.1f\n", names[mode], hot ? "L2" : "DRAM", used, col4, stages, us,
                bytes / us / 1e6, bytes / (us * 1e-6) / (clk_khz * 1e3) / used);
    return true;
  };
  std::printf("%-5s %-6s %5s %6s %6s %8s %8s %10s\n", "mode", "cache", "SMs", "CTA/SM", "stages", "us", "TB/s", "B/clk/SM");
  for (int hot = 0; hot < 2; ++hot)
    for (int used : {112, sms})
      for (int per_sm : {1, 2})
        for (int stages : {3, 6, 12})
          for (int mode = 0; mode < 3; ++mode) {
            if (per_sm * stages * kTileBytes > 220 * 1024) continue;
            const int smem = stages * kTileBytes + 1024;
            // per_sm == 2 needs two CTAs to fit; one CTA per SM: make it take the whole SM
            const int smem_req = per_sm == 1 ? std::max(smem, 120 * 1024) : smem;
            const int pages = hot ? 2048 : static_cast<int>(big_pages);
            if (!measure(used, used * per_sm, 64, smem_req, pages, stages, mode, 1234u, 1, hot, per_sm)) return 4;
          }
  std::printf("\none CTA per SM, W issuing warps\n%-5s %-6s %5s %6s %6s %8s %8s %10s\n", "mode", "cache", "SMs", "W",
              "stages", "us", "TB/s", "B/clk/SM");
  for (int hot = 0; hot < 2; ++hot)
    for (int used : {112, sms})
      for (int issuers : {1, 2, 4})
        for (int stages : {4, 8, 12})
          for (int mode = 1; mode < 3; ++mode) {
            const int smem_req = std::max(stages * kTileBytes + 1024, 120 * 1024);
            const int pages = hot ? 2048 : static_cast<int>(big_pages);
            if (!measure(used, used, 128, smem_req, pages, stages, mode, 4321u, issuers, hot, issuers)) return 4;
          }
  // Few SMs from DRAM, timed inside the kernel.
  unsigned long long* span = nullptr;
  if (cudaMalloc(&span, 2 * sizeof(unsigned long long)) != cudaSuccess) return 5;
  std::printf("\nfew SMs from DRAM, one CTA per SM, timed inside the kernel (first start to last end)\n"
              "%-5s %5s %6s %3s %6s %8s %8s %10s\n", "mode", "SMs", "tiles", "W", "stages", "us", "TB/s", "B/clk/SM");
  for (int used : {32, 64})
    for (int tiles : {8, 64})
      for (int issuers : {1, 2, 4})
        for (int stages : {3, 6, 12})
          for (int mode : {0, 2}) {
            if (stages < issuers) continue;
            const int smem_req = std::max(stages * kTileBytes + 1024, 120 * 1024);
            std::vector<double> ts;
            for (int r = 0; r < 7; ++r) {
              const unsigned long long init[2] = {~0ull, 0ull};
              cudaMemcpy(span, init, sizeof(init), cudaMemcpyHostToDevice);
              stream<<<used, 128, smem_req>>>(map2, map1, cache, static_cast<int>(big_pages), tiles, stages, mode,
                                              999u + r * 31u, issuers, span);
              unsigned long long got[2];
              cudaMemcpy(got, span, sizeof(got), cudaMemcpyDeviceToHost);
              ts.push_back((got[1] - got[0]) / 1e3);
            }
            if (cudaGetLastError() != cudaSuccess) return 6;
            std::sort(ts.begin(), ts.end());
            const double us = ts[3], bytes = double(used) * tiles * kTileBytes;
            std::printf("%-5s %5d %6d %3d %6d %8.2f %8.2f %10.1f\n", names[mode], used, tiles, issuers, stages, us,
                        bytes / us / 1e6, bytes / (us * 1e-6) / (clk_khz * 1e3) / used);
          }
  return 0;
}
