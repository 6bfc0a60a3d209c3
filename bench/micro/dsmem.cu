// The time of attn2's cluster merge done as a pull (remote loads of every
// rank's rows after a cluster barrier), by threads, ranks and bytes per load.
//
// docs/attn2.md sets the pull aside for the push that dsmem_push.cu times.
// Here 14 clusters of 16 CTAs (2 per SM, 100 KB of shared memory each, as
// attn2's TP8 grid) or 2 clusters, every CTA holding a 64-row x 64-column fp32
// state; after the barrier, CTA r reads its 4 rows' 64 columns from every rank
// (16 threads per row, one 16-byte load per rank per thread: 16 KB per CTA)
// and sums them. The variants (the list above `merge`) change who loads what
// and how many bytes; the one marked "(attn2)" is the pattern just described.
//
//   cmake --build build --target dsmem && build/dsmem
//
// One line per variant and grid (224, then 32 CTAs): "per CTA" is the median
// over CTAs of the time from the barrier's exit to the end of the CTA's loads
// (%globaltimer), "span" the first CTA's barrier exit to the last CTA's end;
// each the median over 30 launches, in us. The last line is the device's
// error state ("no error").
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cta_times.h"
#include "common/ptx.cuh"

namespace cg = cooperative_groups;
constexpr int kCluster = 16, kRows = 64, kStride = 68, kSmem = 100 * 1024;

namespace ptx = muse_decode::ptx;

// Kept here, not in ptx.cuh: the product merges by pushing (st.async) and
// never loads through the cluster's shared-memory window.
__device__ __forceinline__ float4 ld_cluster_v4_f32(uint32_t remote) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
// The 8-byte form, kept here for the same reason.
__device__ __forceinline__ float2 ld_cluster_v2_f32(uint32_t remote) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

__device__ float4 ld_remote(const float* p, int rank) {
  return ld_cluster_v4_f32(ptx::map_to_rank(ptx::smem_addr(p), rank));
}

// kMode 0: 64 threads, 16 ranks ("attn2"); 1: 64 threads, 8 ranks; 2: 256 threads, 4 ranks each (all 16
// ranks covered); 3: 64 threads, own rank 16 times; 4: 64 threads, 16 ranks, 8-byte loads (half the bytes);
// 5: no loads (barrier only)
template <int kMode>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(256, 2) merge(unsigned long long* out, float* sink) {
  extern __shared__ float sm[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  for (int i = threadIdx.x; i < kRows * kStride; i += 256) sm[i] = i * 1e-3f + rank;
  cluster.sync();
  const unsigned long long t0 = ptx::globaltimer();
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
      for (int k = 0; k < 16; ++k) v[k] = ld_cluster_v2_f32(ptx::map_to_rank(ptx::smem_addr(src), k));
#pragma unroll
      for (int k = 0; k < 16; ++k) acc += v[k].x + v[k].y;
    }
  }
  __syncthreads();
  const unsigned long long t1 = ptx::globaltimer();
  if (acc == 12345.0f) sink[0] = acc;
  ptx::cluster_arrive_relaxed();
  ptx::cluster_wait();
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
