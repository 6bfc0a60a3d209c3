// Does compute-sanitizer's racecheck report a race across a CTA-wide
// __syncthreads in the patterns attn2's kernel uses around it? Each kernel
// is race-free by construction: warpgroup 1 writes a shared buffer, every
// live thread passes __syncthreads, warpgroup 0 reads it. Modes:
//   0 plain; 1 bar.sync 1, 128 in warpgroup 0 first; 2 each warpgroup its
//   own named barrier (1, 2); 3 a cluster barrier (arrive before, wait
//   after; clusters of 2); 4 an mbarrier arrive and try_wait loop first;
//   5 warps 6 and 7 exit before the barrier; 6 griddepcontrol.launch_dependents
//   first (attn2's general kernel triggers before its exchange), plain and
//   with PDL allowed; 7 only warpgroup 0 passes an mbarrier (arrive, then
//   try_wait) first, then thread 0 writes and warpgroup 1 reads across the
//   __syncthreads (attn2's s_last after the receive barrier's wait); 8 the
//   same mbarrier in warpgroup 0, warpgroup 1 writes and 0 reads; 9 mode 3
//   with the relaxed arrival attn2 uses (clusters of 2 and 16), and 10 the
//   same with a second __syncthreads between the arrival and the write (as
//   attn2's one-slice kernels: their arrival before the key loop, CTA
//   barriers after it). Then the plain pattern in
//   clusters of 2, 8 and 16 CTAs (16: non-portable), each CTA delayed by its
//   rank so that the ranks' accesses interleave in time, with and without a
//   store into the next rank's shared memory before a closing cluster
//   barrier (attn2's kernels of 16 are where racecheck reports).
// Launched through the ops' own launch path (src/common/launch.cuh).
//   nvcc -arch=sm_90a -o rc bench/micro/racecheck_named.cu
//   compute-sanitizer --tool racecheck ./rc
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "launch.cuh"

using muse_decode::detail::launch_kernel;
using muse_decode::detail::LaunchShape;

template <int kMode>
__global__ void __launch_bounds__(256) across_sync(float* out) {
  __shared__ float buf[128];
  __shared__ __align__(8) uint64_t bar;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (kMode == 4 || kMode == 7 || kMode == 8) {
    if (threadIdx.x == 0) {
      const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(kMode == 4 ? 256 : 128) : "memory");
    }
    __syncthreads();
  }
  if ((kMode == 1 || kMode == 2) && wg == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
  if (kMode == 2 && wg == 1) asm volatile("bar.sync 2, 128;" ::: "memory");
  if (kMode == 3) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  if (kMode == 9 || kMode == 10) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  if (kMode == 10) __syncthreads();
  if (kMode == 4 || ((kMode == 7 || kMode == 8) && wg == 0)) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    uint64_t state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(a) : "memory");
    uint32_t done = 0;
    while (!done)
      asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(done) : "r"(a), "r"(0) : "memory");
  }
  if (kMode == 5 && threadIdx.x >= 192) return;
  if (kMode == 6) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (kMode == 7) {
    if (threadIdx.x == 0) buf[0] = 1.0f;
    __syncthreads();
    if (wg == 1) out[blockIdx.x * 128 + t] = buf[0];
  } else {
    if (wg == 1) buf[t] = static_cast<float>(t);
    __syncthreads();
    if (wg == 0) out[blockIdx.x * 128 + t] = buf[t];
  }
  if (kMode == 3 || kMode == 9 || kMode == 10) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <int kRemote>
__global__ void __launch_bounds__(256) across_sync_cluster(float* out) {
  __shared__ float buf[128];
  __shared__ float inbox[256];
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const long long start = clock64();
  while (clock64() - start < 2000ll * rank) {
  }
  if (wg == 1) buf[t] = static_cast<float>(t + rank);
  __syncthreads();
  float v = 0.0f;
  if (wg == 0) v = buf[t];
  if (kRemote) {
    uint32_t nranks;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nranks));
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    uint32_t remote;
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(&inbox[threadIdx.x]));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"((rank + 1) % nranks));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    v += inbox[threadIdx.x];
  }
  if (wg == 0) out[blockIdx.x * 128 + t] = v;
}

template <int kRemote>
static void launch_clusters(float* out, int cluster) {
  if (cluster > 8 &&
      cudaFuncSetAttribute(across_sync_cluster<kRemote>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
          cudaSuccess)
    std::printf("cluster %d: non-portable size refused\n", cluster);
  const auto e = static_cast<cudaError_t>(
      launch_kernel<across_sync_cluster<kRemote>>(LaunchShape{dim3(2 * cluster), dim3(256), 0, cluster}, nullptr, out));
  const cudaError_t s = cudaDeviceSynchronize();
  std::printf("clusters of %d, remote store %d: %s / %s\n", cluster, kRemote, cudaGetErrorString(e),
              cudaGetErrorString(s));
}

int main() {
  float* out;
  if (cudaMalloc(&out, 128 * 32 * sizeof(float)) != cudaSuccess) return 1;
  across_sync<0><<<4, 256>>>(out);
  across_sync<1><<<4, 256>>>(out);
  across_sync<2><<<4, 256>>>(out);
  if (launch_kernel<across_sync<3>>(LaunchShape{dim3(4), dim3(256), 0, 2}, nullptr, out) != 0)
    std::printf("mode 3 launch failed\n");
  cudaFuncSetAttribute(across_sync<9>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(across_sync<10>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int c : {2, 16}) {  // modes 9 and 10 in clusters of 2 and of 16 (32 CTAs)
    const LaunchShape shape{dim3(c == 2 ? 4 : 32), dim3(256), 0, c};
    if (launch_kernel<across_sync<9>>(shape, nullptr, out) != 0) std::printf("mode 9 launch failed\n");
    if (launch_kernel<across_sync<10>>(shape, nullptr, out) != 0) std::printf("mode 10 launch failed\n");
  }
  across_sync<4><<<4, 256>>>(out);
  across_sync<5><<<4, 256>>>(out);
  across_sync<6><<<4, 256>>>(out);
  across_sync<7><<<4, 256>>>(out);
  across_sync<8><<<4, 256>>>(out);
  for (int i = 0; i < 2; ++i)  // mode 6 again, launched with programmatic dependent launch allowed, twice
    if (launch_kernel<across_sync<6>>(LaunchShape{dim3(4), dim3(256), 0, 0, true}, nullptr, out) != 0)
      std::printf("mode 6 PDL launch failed\n");
  for (int cluster : {2, 8, 16}) {
    launch_clusters<0>(out, cluster);
    launch_clusters<1>(out, cluster);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("racecheck_named: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
