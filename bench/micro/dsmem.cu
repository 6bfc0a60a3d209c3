// The cost of attn2's cluster merge pattern in isolation: 14 clusters of 16
// CTAs (2 per SM, ~100 KB of shared memory each, as attn2 at TP8), every CTA
// holding a 64-row x 64-column fp32 state; after a cluster barrier, CTA r
// reads its 4 rows' 64 columns from every rank (16 threads per row, one
// 16-byte load per rank per thread) and sums them. Variants change who loads
// what; the kernel is timed from the barrier to the end of the loads
// (%globaltimer, the slowest CTA), median over launches.
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

#include "cta_times.h"

namespace cg = cooperative_groups;
constexpr int kCluster = 16, kRows = 64, kStride = 68, kSmem = 100 * 1024;

__device__ unsigned long long ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ float4 ld_remote(const float* p, int rank) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p)), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(r) : "memory");
  return v;
}

// kMode 0: 64 threads, 16 ranks (attn2); 1: 64 threads, 8 ranks; 2: 256 threads, 4 ranks each (all 16 ranks
// covered); 3: 64 threads, own rank 16 times; 4: 64 threads, 16 ranks, 8-byte loads (half the bytes);
// 5: no loads (barrier only)
template <int kMode>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(256, 2) merge(unsigned long long* out, float* sink) {
  extern __shared__ float sm[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  for (int i = threadIdx.x; i < kRows * kStride; i += 256) sm[i] = i * 1e-3f + rank;
  cluster.sync();
  const unsigned long long t0 = ns();
  float acc = 0.0f;
  const int row = rank * 4 + (threadIdx.x % 64) / 16, d = (threadIdx.x % 16) * 4;
  const float* src = sm + row * kStride + d;
  if (kMode == 0 || kMode == 1 || kMode == 3) {
    if (threadIdx.x < 64) {
      float4 v[16];
      const int n = kMode == 1 ? 8 : 16;
#pragma unroll
      for (int k = 0; k < 16; ++k)
        if (k < n) v[k] = ld_remote(src, kMode == 3 ? rank : k);
#pragma unroll
      for (int k = 0; k < 16; ++k)
        if (k < n) acc += v[k].x + v[k].y + v[k].z + v[k].w;
    }
  } else if (kMode == 2) {
    float4 v[4];
    const int k0 = (threadIdx.x / 64) * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = ld_remote(src, k0 + k);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc += v[k].x + v[k].y + v[k].z + v[k].w;
  } else if (kMode == 4) {
    if (threadIdx.x < 64) {
      float2 v[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(src)), r;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(k));
        asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v[k].x), "=f"(v[k].y) : "r"(r) : "memory");
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) acc += v[k].x + v[k].y;
    }
  }
  __syncthreads();
  const unsigned long long t1 = ns();
  if (acc == 12345.0f) sink[0] = acc;
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = t0;
    out[2 * blockIdx.x + 1] = t1;
  }
}

template <int kMode>
void run(const char* name, int ctas, unsigned long long* d_out, float* sink) {
  cudaFuncSetAttribute(merge<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(merge<kMode>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  CtaTimes t;
  std::vector<unsigned long long> h(2 * ctas);
  for (int rep = 0; rep < 30; ++rep) {
    merge<kMode><<<ctas, 256, kSmem>>>(d_out, sink);
    cudaMemcpy(h.data(), d_out, h.size() * 8, cudaMemcpyDeviceToHost);
    t.add(h, ctas);
  }
  std::printf("%-44s %4d CTAs: per CTA (median) %.3f us, barrier-to-last-load span %.3f us\n", name, ctas,
              CtaTimes::median(t.each), CtaTimes::median(t.span));
}

int main() {
  unsigned long long* d_out;
  float* sink;
  cudaMalloc(&d_out, 2 * 224 * 8);
  cudaMalloc(&sink, 4);
  for (int ctas : {224, 32}) {
    run<0>("64 threads x 16 ranks, 16 B (attn2)", ctas, d_out, sink);
    run<1>("64 threads x 8 ranks, 16 B", ctas, d_out, sink);
    run<4>("64 threads x 16 ranks, 8 B", ctas, d_out, sink);
    run<2>("256 threads x 4 ranks, 16 B", ctas, d_out, sink);
    run<3>("64 threads x own rank 16 times, 16 B", ctas, d_out, sink);
    run<5>("no loads", ctas, d_out, sink);
  }
  std::printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
