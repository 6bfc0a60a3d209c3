// The time of attn2's cluster merge done as a push: every CTA of a cluster
// of 16 sends each rank its rows and waits until its own have landed, by the
// mechanism that carries the bytes (st.async, stores, bulk copies, or a pull).
//
// Each CTA holds 64 rows of fp16 O (128 B a row) and 64 rows of (m, l, 2^e)
// (16 B); after a cluster barrier it sends rows [4k, 4k + 4) to rank k and
// waits on its own mbarrier until its 16 x 576 bytes have arrived (attn2's
// push: docs/attn2.md, "Merges"). Grids of 2 and 14 clusters, 2 CTAs per SM
// (100 KB of shared memory each) or 1 (200 KB; 2 clusters only). The modes
// (the list above `push`) change how the bytes travel and how many there are;
// "(attn2)" marks attn2's form.
//
//   cmake --build build --target dsmem_push && build/dsmem_push
//
// One line per mode, grid and CTAs per SM: "per CTA" is the median over CTAs
// of the time from the barrier's exit to the end of the CTA's wait (for the
// stores, after their second cluster barrier; for the pull, after its loads),
// by %globaltimer; "span" the first CTA's barrier exit to the last CTA's end;
// each the median over 35 launches (after 5 of warm-up), in us. The last line
// is the device's error state ("no error").
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cta_times.h"
#include "common/ptx.cuh"

namespace cg = cooperative_groups;
constexpr int kCluster = 16, kRows = 64, kRowBytes = 128, kMlBytes = 16, kOwned = kRows / kCluster;
constexpr int kStateBytes = kRows * (kRowBytes + kMlBytes);  // 9216, sent and received by every CTA
constexpr int kRecv = 16 * 1024;                              // receive area offset

namespace ptx = muse_decode::ptx;

// The 8-byte st.async is kept here, not in ptx.cuh: the product pushes 16 bytes
// a store (ptx::st_async_v4).
__device__ __forceinline__ void st_async_v2(uint32_t remote, uint2 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(remote),
               "r"(v.x), "r"(v.y), "r"(remote_bar)
               : "memory");
}
// Kept here: the product copies no shared memory to another CTA by bulk copy
// (docs/attn2.md sets the bulk-copy push aside).
__device__ __forceinline__ void bulk_copy_s2cluster(uint32_t remote, uint32_t src, uint32_t bytes,
                                                    uint32_t remote_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   remote),
               "r"(src), "r"(bytes), "r"(remote_bar)
               : "memory");
}
// Kept here: the product never stores through the cluster's shared-memory
// window with generic stores (it pushes by st.async).
__device__ __forceinline__ void st_cluster_v4(uint32_t remote, uint4 v) {
  asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
// Kept here: the product never loads through the cluster's shared-memory
// window (its merge is a push).
__device__ __forceinline__ uint4 ld_cluster_v4(uint32_t remote) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

// Modes (bytes per CTA in brackets):
// 0 st.async 16 B by 256 threads, rows to their owners (attn2, 9216)
// 1 st.async 8 B (same bytes, twice the stores)
// 2 st.async 16 B, half the rows' bytes (4608)
// 3 st.async 16 B, every store to this CTA itself (9216, no network)
// 4 bulk copies, 2 per owner (9216)
// 5 bulk copies, 1 per owner (9216)
// 6 st.async 16 B by 64 threads only (9216)
// 7 st.async 16 B, a quarter of the bytes (2304)
// 8 nothing sent (barrier and wait only)
// 9 st.shared::cluster 16 B (plain remote stores), then a cluster barrier (release, acquire) to publish them
// 10 the same, every store to this CTA itself
// 11 pull: after the barrier, ld.shared::cluster 16 B of this CTA's rows from every rank, all in flight
template <int kMode>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(256, 1) push(unsigned long long* out) {
  extern __shared__ __align__(1024) unsigned char sm[];
  __shared__ uint64_t bar;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  for (int i = threadIdx.x; i < kStateBytes / 4; i += 256) reinterpret_cast<uint32_t*>(sm)[i] = i * 7 + rank;
  constexpr int kBytes = kMode == 2 ? kStateBytes / 2 : kMode == 7 ? kStateBytes / 4 : kMode >= 8 ? 0 : kStateBytes;
  const uint32_t b = ptx::smem_addr(&bar);
  const uint32_t base = ptx::smem_addr(sm);
  if (threadIdx.x == 0) {
    ptx::mbar_init(b, 1);
    ptx::mbar_arrive_expect_tx(b, kBytes);
  }
  ptx::fence_proxy_async_smem();
  __syncthreads();
  ptx::cluster_arrive_release();
  ptx::cluster_wait();
  const unsigned long long t0 = ptx::globaltimer();
  if (kMode == 0 || kMode == 2 || kMode == 3 || kMode == 6 || kMode == 7) {
    const int chunks = kBytes / 16, step = kMode == 6 ? 64 : 256;
    if (threadIdx.x < step)
      for (int c = threadIdx.x; c < chunks; c += step) {
        // chunk c to owner c / per (attn2: rows of 9 chunks, 4 rows per owner), at slot c % per of this
        // rank's block there
        const int per = max(1, chunks / kCluster), owner = kMode == 3 ? rank : c / per;
        const uint4 v = reinterpret_cast<const uint4*>(sm)[c];
        ptx::st_async_v4(ptx::map_to_rank(base + kRecv + (rank * per + c % per) * 16, owner), v,
                         ptx::map_to_rank(b, owner));
      }
  } else if (kMode == 1) {
    for (int c = threadIdx.x; c < kBytes / 8; c += 256) {
      const int r = c / 18, owner = r / kOwned;
      const uint2 v = reinterpret_cast<const uint2*>(sm)[c];
      st_async_v2(ptx::map_to_rank(base + kRecv + (rank * kOwned * 18 + c % (kOwned * 18)) * 8, owner), v,
                  ptx::map_to_rank(b, owner));
    }
  } else if (kMode == 4) {
    if (threadIdx.x < 2 * kCluster) {
      const int k = threadIdx.x % kCluster;
      if (threadIdx.x < kCluster)
        bulk_copy_s2cluster(ptx::map_to_rank(base + kRecv + rank * kOwned * kRowBytes, k),
                            base + k * kOwned * kRowBytes, kOwned * kRowBytes, ptx::map_to_rank(b, k));
      else
        bulk_copy_s2cluster(ptx::map_to_rank(base + kRecv + kRows * kRowBytes + rank * kOwned * kMlBytes, k),
                            base + kRows * kRowBytes + k * kOwned * kMlBytes, kOwned * kMlBytes,
                            ptx::map_to_rank(b, k));
    }
  } else if (kMode == 5) {
    if (threadIdx.x < kCluster) {
      const int k = threadIdx.x;
      bulk_copy_s2cluster(ptx::map_to_rank(base + kRecv + rank * kOwned * 144, k), base + k * kOwned * 144,
                          kOwned * 144, ptx::map_to_rank(b, k));
    }
  }
  if (kMode == 9 || kMode == 10) {
    constexpr int per = kStateBytes / 16 / kCluster;
    for (int c = threadIdx.x; c < kStateBytes / 16; c += 256) {
      const int owner = kMode == 10 ? rank : c / per;
      const uint4 v = reinterpret_cast<const uint4*>(sm)[c];
      st_cluster_v4(ptx::map_to_rank(base + kRecv + (rank * per + c % per) * 16, owner), v);
    }
    ptx::cluster_arrive_release();
    ptx::cluster_wait();
  } else if (kMode == 11) {
    constexpr int per = kStateBytes / 16 / kCluster;  // 36 chunks from each rank, 576 over 256 threads
    uint4 v[3];
    uint32_t x = 0;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int c = threadIdx.x + i * 256;
      if (c < kStateBytes / 16)
        v[i] = ld_cluster_v4(ptx::map_to_rank(base + (rank * per + c % per) * 16, c / per));
      else
        v[i] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 3; ++i) x ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    reinterpret_cast<uint32_t*>(sm + kRecv)[threadIdx.x] = x;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ptx::mbar_wait_spin(b, 0);
    const unsigned long long t1 = ptx::globaltimer();
    out[2 * blockIdx.x] = t0;
    out[2 * blockIdx.x + 1] = t1;
  }
  __syncthreads();
  // Nobody leaves while a bulk copy may still read its shared memory.
  ptx::cluster_arrive_relaxed();
  ptx::cluster_wait();
}

template <int kMode>
void run(const char* name, int ctas, int smem, unsigned long long* d_out) {
  cudaFuncSetAttribute(push<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(push<kMode>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  CtaTimes t;
  std::vector<unsigned long long> h(2 * ctas);
  for (int rep = 0; rep < 40; ++rep) {
    push<kMode><<<ctas, 256, smem>>>(d_out);
    if (cudaMemcpy(h.data(), d_out, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::printf("%s: %s\n", name, cudaGetErrorString(cudaGetLastError()));
      return;
    }
    if (rep >= 5) t.add(h, ctas);  // the first launches warm up
  }
  std::printf("%-46s %3d CTAs %s: per CTA %.3f us, span %.3f us\n", name, ctas, smem > 120 * 1024 ? "1/SM" : "2/SM",
              CtaTimes::median(t.each), CtaTimes::median(t.span));
}

int main() {
  unsigned long long* d_out;
  cudaMalloc(&d_out, 2 * 224 * 8);
  for (int smem : {100 * 1024, 200 * 1024})
    for (int ctas : {32, 224}) {
      if (smem > 120 * 1024 && ctas > 128) continue;
      run<0>("st.async 16 B, 256 thr (attn2, 9216 B)", ctas, smem, d_out);
      run<1>("st.async 8 B (9216 B)", ctas, smem, d_out);
      run<2>("st.async 16 B, half (4608 B)", ctas, smem, d_out);
      run<7>("st.async 16 B, quarter (2304 B)", ctas, smem, d_out);
      run<6>("st.async 16 B, 64 thr (9216 B)", ctas, smem, d_out);
      run<3>("st.async 16 B, all to itself (9216 B)", ctas, smem, d_out);
      run<4>("bulk, 2 per owner (9216 B)", ctas, smem, d_out);
      run<5>("bulk, 1 per owner (9216 B)", ctas, smem, d_out);
      run<8>("nothing sent", ctas, smem, d_out);
      run<9>("st.shared::cluster 16 B + barrier (9216 B)", ctas, smem, d_out);
      run<10>("st.shared::cluster to itself + barrier", ctas, smem, d_out);
      run<11>("pull ld.shared::cluster 16 B (9216 B)", ctas, smem, d_out);
    }
  std::printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
