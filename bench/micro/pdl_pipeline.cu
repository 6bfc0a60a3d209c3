// Can a call's key copies hide under the call before it? The skeleton of a
// one-cluster-per-KV-head attn2 (no split merge), graph-replayed back to back
// under PDL as the benchmark runs attn2, with no math: each working CTA reads
// a length word and a table word (two dependent global loads, as L and the
// block table), issues all its tiles (16 KB = 4 random 4 KB pages of a 2 GB
// cache, cp.async.bulk, W issuing warps) into shared memory before
// griddepcontrol.wait, waits for them after it, spins `spin` ns (the math and
// merges stand-in), meets its cluster at a barrier and exits. CTAs past the
// working ones read the length word and exit (a deployment grid sized for
// longer L). The question for a redesign: with one CTA per SM holding all of a
// call's 128 KB per CTA (8k at TP8: 2 clusters of 16), does the period come
// down to spin + the fixed chain, the copies overlapped with the call before?
//
// Per configuration: us per call (graph of N calls, median of 7 replays) and,
// from %globaltimer stamps of the last replay, medians over its calls of the
// working CTAs' entry, past-the-wait and all-tiles-landed times (the latter
// the call's last CTA) after the previous call's last exit, and the period.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "launch.cuh"
#include "ptx.cuh"
#include "page_hash.cuh"

constexpr int kPageBytes = 4096, kTilePages = 4, kTileBytes = kTilePages * kPageBytes, kMaxTiles = 12;

using muse_decode::detail::LaunchShape;
using muse_decode::detail::runtime_config;
using muse_decode::ptx::mbar_arrive_expect_tx;
using muse_decode::ptx::mbar_init;
using muse_decode::ptx::mbar_wait;
using muse_decode::ptx::smem_addr;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

struct Args {
  const char* cache;
  const int* lens;   // [calls]: a length word per call (nonzero)
  const int* table;  // [calls * grid]: a seed word per CTA and call
  unsigned pages;
  int call, tiles, work_ctas, issuers, trigger_early;
  unsigned spin_ns;
  unsigned long long* rec;  // [calls][grid][4]: entry, past wait, landed, exit
};

__global__ void call_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kMaxTiles];
  const unsigned long long t0 = now_ns();
  if (a.trigger_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int cta = blockIdx.x, grid = gridDim.x;
  const int L = *reinterpret_cast<const volatile int*>(&a.lens[a.call]);
  unsigned long long* rec = a.rec + (static_cast<int64_t>(a.call) * grid + cta) * 4;
  if (cta >= a.work_ctas || L == 0) {  // idle: leaves once it knows L
    if (threadIdx.x == 0) {
      rec[0] = t0;
      rec[1] = rec[2] = 0;
      rec[3] = now_ns();
    }
    if (!a.trigger_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    return;
  }
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  if (threadIdx.x == 0) {
    for (int t = 0; t < a.tiles; ++t) mbar_init(smem_addr(&full[t]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (w < a.issuers) {
    const unsigned seed = static_cast<unsigned>(a.table[static_cast<int64_t>(a.call) * grid + cta]) ^ static_cast<unsigned>(L);
    for (int t = w; t < a.tiles; t += a.issuers) {
      const uint32_t bar = smem_addr(&full[t]);
      if (lane == 0) mbar_arrive_expect_tx(bar, kTileBytes);
      __syncwarp();
      if (lane < kTilePages) {
        const uint32_t page = hash(seed * 977u + t * 131u + lane) % a.pages;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         base + t * kTileBytes + lane * kPageBytes),
                     "l"(a.cache + static_cast<int64_t>(page) * kPageBytes), "r"(kPageBytes), "r"(bar)
                     : "memory");
      }
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long t1 = now_ns();
  if (!a.trigger_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int t = 0; t < a.tiles; ++t) mbar_wait(smem_addr(&full[t]), 0);
  const unsigned long long t2 = now_ns();
  while (now_ns() < t2 + a.spin_ns) {
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0) {
    rec[0] = t0;
    rec[1] = t1;
    rec[2] = t2;
    rec[3] = now_ns();
  }
}

static double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const unsigned pages = 1u << 19;  // 2 GB of 4 KB pages
  char* cache = nullptr;
  if (cudaMalloc(&cache, static_cast<size_t>(pages) * kPageBytes) != cudaSuccess) return 1;
  cudaMemset(cache, 1, static_cast<size_t>(pages) * kPageBytes);
  constexpr int kCalls = 120, kMaxGrid = 264;
  std::vector<int> hl(kCalls, 2048), ht(static_cast<size_t>(kCalls) * kMaxGrid);
  for (size_t i = 0; i < ht.size(); ++i) ht[i] = static_cast<int>(i * 2654435761u);
  int *lens = nullptr, *table = nullptr;
  unsigned long long* rec = nullptr;
  cudaMalloc(&lens, kCalls * sizeof(int));
  cudaMalloc(&table, ht.size() * sizeof(int));
  cudaMalloc(&rec, static_cast<size_t>(kCalls) * kMaxGrid * 4 * sizeof(unsigned long long));
  cudaMemcpy(lens, hl.data(), kCalls * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(table, ht.data(), ht.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(call_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024);
  cudaFuncSetAttribute(call_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);

  // Clusters of 16 and PDL, the attributes of the ops' own launches.
  auto config_of = [&](int grid, int smem, cudaLaunchAttribute (&at)[2]) {
    return runtime_config(LaunchShape{dim3(grid), dim3(256), static_cast<unsigned>(smem), 16, true}, at, st);
  };
  for (int smem : {130 * 1024, 100 * 1024}) {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t c = config_of(16, smem, at);
    int clusters = 0;
    cudaOccupancyMaxActiveClusters(&clusters, call_kernel, &c);
    std::printf("SMs %d; clusters of 16 co-resident with %d KB per CTA: %d\n", sms, smem / 1024, clusters);
  }

  std::printf("%-5s %5s %5s %3s %4s %6s | %8s | %7s %7s %7s %7s\n", "tiles", "work", "grid", "W", "trig", "spin", "us/call",
              "entry", "wait", "landed", "period");
  auto run = [&](int tiles, int work, int grid, int issuers, int trig, unsigned spin, int smem) {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t c = config_of(grid, smem, at);
    cudaGraph_t g;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < kCalls; ++i) {
      Args a{cache, lens, table, pages, i, tiles, work, issuers, trig, spin, rec};
      cudaLaunchKernelEx(&c, call_kernel, a);
    }
    cudaStreamEndCapture(st, &g);
    cudaGraphExec_t ge;
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
      std::printf("instantiate failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return false;
    }
    cudaGraphLaunch(ge, st);
    cudaStreamSynchronize(st);
    std::vector<double> us;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, st);
      cudaGraphLaunch(ge, st);
      cudaEventRecord(e1, st);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      us.push_back(ms * 1e3 / kCalls);
    }
    if (cudaGetLastError() != cudaSuccess) {
      std::printf("launch failed\n");
      return false;
    }
    std::vector<unsigned long long> h(static_cast<size_t>(kCalls) * grid * 4);
    cudaMemcpy(h.data(), rec, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    std::vector<double> entry, wait, landed, period;
    unsigned long long prev_end = 0;
    for (int k = 0; k < kCalls; ++k) {
      unsigned long long end = 0, last_landed = 0;
      std::vector<double> en, wa;
      for (int b = 0; b < grid; ++b) {
        const unsigned long long* r = &h[(static_cast<size_t>(k) * grid + b) * 4];
        end = std::max(end, r[3]);
        if (b < work) {
          last_landed = std::max(last_landed, r[2]);
          if (prev_end) {
            en.push_back((static_cast<double>(r[0]) - prev_end) * 1e-3);
            wa.push_back((static_cast<double>(r[1]) - prev_end) * 1e-3);
          }
        }
      }
      if (prev_end && k > 4) {
        entry.push_back(median(en));
        wait.push_back(median(wa));
        landed.push_back((static_cast<double>(last_landed) - prev_end) * 1e-3);
        period.push_back((static_cast<double>(end) - prev_end) * 1e-3);
      }
      prev_end = end;
    }
    std::printf("%5d %5d %5d %3d %4s %6.2f | %8.2f | %7.2f %7.2f %7.2f %7.2f\n", tiles, work, grid, issuers,
                trig ? "start" : "wait", spin * 1e-3, median(us), median(entry), median(wait), median(landed),
                median(period));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return true;
  };
  // 8k at TP8 on one cluster per KV head: 32 CTAs x 8 tiles (4 MB); 2k: 2 tiles.
  for (int tiles : {8, 2})
    for (int grid : {32, 112})
      for (int issuers : {1, 4})
        for (int trig : {1, 0})
          for (unsigned spin : {0u, 1000u, 2000u})
            if (!run(tiles, 32, grid, issuers, trig, spin, 130 * 1024)) return 2;
  // The same bytes on two CTAs per SM (4 tiles each, 64 CTAs): does a second slot help?
  for (int grid : {64, 224})
    for (int trig : {1, 0})
      for (unsigned spin : {0u, 2000u})
        if (!run(4, 64, grid, 2, trig, spin, 100 * 1024)) return 2;
  return 0;
}
