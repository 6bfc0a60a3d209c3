// The synchronization of the ops' kernels, cut down to the access pairs that
// compute-sanitizer reports on them, in kernels that are correct by the PTX
// memory model: where a pattern here draws the same report as the op, the
// report is the tool's. scripts/sanitize.sh runs this binary under the tool
// in the same run as the ops' tests and honours a named suppression of
// scripts/sanitize.supp only while the pattern that entry names reproduces
// its report here.
//
//   sanitizer_patterns race     every pattern below, one launch each (run
//                               under racecheck, and under synccheck for the
//                               cluster merge's barrier protocol)
//   sanitizer_patterns open     (synccheck) CTAs of a launch without clusters
//                               exit with a barrier phase armed for bytes
//                               nobody sends
//   sanitizer_patterns closed   the same phase closed by complete_tx before
//                               exit
//   sanitizer_patterns unwaited | rank0_exits
//                               (racecheck) qkv_front's split cluster
//                               barrier in clusters of 3: warps 1.. exit
//                               between arrival and wait, or all of rank 0
//                               does (docs/sanitizers.md)
//   sanitizer_patterns waves C N plain|ring
//                               one exchange<C, 0 or kRing> over N CTAs: does
//                               the tool's run depend on the cluster size, or
//                               on clusters placed in later waves?
//
// Patterns (the kernel names in the program's output; racecheck's reports
// name the two access sites, file:line, which is what scripts/sanitize.sh
// matches):
//   route_publish         route's metadata barrier without the warp barrier
//       its kernel has between init and arrival: CTA 0's thread 0 inits it,
//       fences and arrives expecting every CTA's bytes, in a block small
//       enough that nvcc if-converts it; the init then runs once for warp 0
//       on the uniform datapath (VOTEU.ALL, then @!UP0 SYNCS.EXCH.64), with
//       all 32 lanes active, before lane 0's arrival. Every CTA ORs words
//       into CTA 0 by red.async after the cluster barrier, and CTA 0 reads
//       them after its wait.
//   exchange<C, flags>    attn2's key-half exchange in attn2's geometry (256
//       threads, 2 CTAs per SM, clusters of C), through attn2's own
//       stash_second_half and merge_second_half (src/attn2/merge.cuh, so that
//       a report names the same lines as the op's): warpgroup 1 stores its
//       state (9 float4 per thread) over warpgroup 0's first stages,
//       __syncthreads, warpgroup 0 loads it. flags: kPreexit,
//       griddepcontrol.launch_dependents between the barrier and the loads
//       (attn2's trigger); kTrailingBar, a __syncthreads after the loads;
//       kRing, before it attn2's key loop: per warpgroup a ring of 3 stages
//       filled by TMA tensor boxes (full / empty mbarriers, spin waits), the
//       last tile's V rows zeroed behind the warpgroup's named barrier by
//       both warpgroups, or with kHalfTail by warpgroup 0 only (attn2: the
//       tile past L belongs to one warpgroup, so one named barrier of the
//       CTA's two is used); kPush, around it the cluster merge: relaxed
//       cluster arrival before the stores, cluster wait after the loads, then
//       every CTA pushes 9216 / C bytes to each rank by st.async completing
//       on that rank's receive barrier, which thread 0 armed once the CTA
//       stays, and warpgroup 0 waits on its own and reads the 9216; kLeave,
//       the odd clusters leave after the init barrier with their receive
//       barrier initialised only (attn2's slices past the active ones);
//       kClusterMerge, after the loads attn2's own cluster merge
//       (ClusterMerge: encode, cluster wait, push, from registers in
//       clusters of 16, then the mergers wait on the receive barrier and
//       combine); kEarlyArrive, the relaxed cluster arrival before the ring
//       instead of after it (attn2's early push: short loops, so the other
//       ranks' pushes may land while this CTA is still in its exchange);
//       kSecondHalfBar, warpgroup 1 alone passes its named barrier once
//       before its stores; kHalfTailSecond, the ring's tail zeroed by
//       warpgroup 1 only (both: one more named barrier in warpgroup 1 than in
//       warpgroup 0, as in attn2's CTA whose warpgroup 1 holds the tile past
//       L, which racecheck flags).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "attn2/merge.cuh"
#include "common/launch.cuh"
#include "common/ptx.cuh"
#include "common/tensor_map.h"

namespace ptx = muse_decode::ptx;
namespace a2 = muse_decode::attn2_impl;
using muse_decode::detail::launch_kernel;
using muse_decode::detail::LaunchShape;

namespace {

constexpr int kThreads = 256, kHalf = 128, kRowWarps = 4;

// ---- route ------------------------------------------------------------------------
constexpr int kRouteCtas = 8, kRouteWords = 8;  // words each CTA ORs into CTA 0

__global__ void __launch_bounds__(kThreads, 1) route_publish(uint32_t* out) {
  __shared__ uint32_t words[kRouteCtas * kRouteWords];
  __shared__ uint64_t bar;
  const int t = blockIdx.x;
  if (t == 0) {
    if (threadIdx.x < kRouteCtas * kRouteWords) words[threadIdx.x] = 0u;
    if (threadIdx.x == 0 && gridDim.x > 1) {
      ptx::mbar_init(&bar, 1);
      ptx::fence_mbarrier_init();
      ptx::mbar_arrive_expect_tx(&bar, gridDim.x * kRouteWords * 4);
    }
  }
  ptx::cluster_arrive_release();
  __syncthreads();
  ptx::cluster_wait();
  if (threadIdx.x < kRouteWords)
    ptx::red_async_or(ptx::map_to_rank(ptx::smem_addr(&words[t * kRouteWords + threadIdx.x]), 0), 1u << t,
                      ptx::map_to_rank(ptx::smem_addr(&bar), 0));
  if (t != 0) return;
  ptx::mbar_wait<true>(ptx::smem_addr(&bar), 0);
  if (threadIdx.x < kRouteCtas * kRouteWords) out[threadIdx.x] = words[threadIdx.x];
}

// ---- attn2's exchange ------------------------------------------------------------------
enum Flags : int {
  kPreexit = 1, kTrailingBar = 2, kRing = 4, kPush = 8, kHalfTail = 16, kLeave = 32, kClusterMerge = 64, kEarlyArrive = 128,
  kSecondHalfBar = 256, kHalfTailSecond = 512, kTailBarrier1 = 1024, kTailMbarrier = 2048, kExchangeBar3 = 4096
};
constexpr int kStages = 3, kStageBytes = 16384, kHalfBytes = kStageBytes / 2, kTiles = 4;
constexpr int kRecvOffset = a2::kRecvOffset;                         // attn2: in warpgroup 0's last stage
constexpr int kRecvBytes = a2::kRecvBytes;                           // 9216 from the cluster
constexpr int kDynSmem = 2 * kStages * kStageBytes + 8192 + 1024;   // attn2's plan: 2 CTAs per SM
constexpr int kBoxRows = 64;                                        // a box: 64 rows x 128 bytes = 8 KB
constexpr int kMaxCtas = 512;                                       // the largest exchange launch

template <int kCluster, int kFlags>
__global__ void __launch_bounds__(kThreads, 2) exchange(const __grid_constant__ CUtensorMap map, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[2 * kStages];
  __shared__ uint64_t empty[2 * kStages];
  __shared__ uint64_t recv;
  __shared__ uint64_t tail_bar[2];  // (kTailMbarrier) per warpgroup: its 4 warps zeroed their rows
  const int kh = threadIdx.x / kHalf, rw = threadIdx.x / 32 % kRowWarps, lane = threadIdx.x % 32;
  const uint32_t rank = static_cast<uint32_t>(blockIdx.x) % kCluster;
  const uint32_t base = (ptx::smem_addr(smem) + 1023u) & ~1023u;
  if (threadIdx.x == 0) {
    for (int st = 0; st < 2 * kStages; ++st) {
      ptx::mbar_init(&full[st], 1);
      ptx::mbar_init(&empty[st], kRowWarps);
    }
    ptx::mbar_init(&recv, 1);
    ptx::mbar_init(&tail_bar[0], kRowWarps);
    ptx::mbar_init(&tail_bar[1], kRowWarps);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if ((kFlags & kLeave) && blockIdx.x / kCluster % 2 == 1) return;  // the whole cluster leaves
  if ((kFlags & (kPush | kClusterMerge)) && threadIdx.x == 0) ptx::mbar_arrive_expect_tx(&recv, kRecvBytes);
  // attn2's early push: the receive area opens before the key loop (no stage
  // over it is filled), so the other ranks' pushes may land during the
  // exchange.
  if (kFlags & kEarlyArrive) ptx::cluster_arrive_relaxed();
  float acc = 0.0f;
  if (kFlags & kRing) {
    const auto issue = [&](int j) {  // (warp 0 of the warpgroup) tile j: two boxes into its stage
      const int st = kh * kStages + j % kStages;
      if (lane == 0) {
        ptx::mbar_arrive_expect_tx(&full[st], kStageBytes);
        for (int h = 0; h < 2; ++h)
          ptx::tma_load_2d(base + st * kStageBytes + h * kHalfBytes, &map, ptx::smem_addr(&full[st]), 0,
                           (2 * j + h) * kBoxRows);
      }
      __syncwarp();
    };
    if (rw == 0)
      for (int j = 0; j < kStages; ++j) issue(j);
    for (int it = 0; it < kTiles; ++it) {
      const int st = kh * kStages + it % kStages;
      ptx::mbar_wait_spin(&full[st], (it / kStages) & 1);
      const uint32_t stage = base + st * kStageBytes;
      const bool tail = kFlags & kHalfTail ? kh == 0 : kFlags & kHalfTailSecond ? kh == 1 : true;
      if (it == kTiles - 1 && tail) {  // attn2's tile past L: V rows zeroed
        ptx::st_shared_v4(stage + kHalfBytes + (threadIdx.x % kHalf) * 16, 0, 0, 0, 0);
        ptx::fence_proxy_async_smem();
        if (kFlags & kTailMbarrier) {
          __syncwarp();
          if (lane == 0) ptx::mbar_arrive(&tail_bar[kh]);
          ptx::mbar_wait_spin(&tail_bar[kh], 0);
        } else if (kh == 0 || (kFlags & kTailBarrier1)) {
          asm volatile("bar.sync 1, 128;" ::: "memory");
        } else {
          asm volatile("bar.sync 2, 128;" ::: "memory");
        }
      }
      float v;
      asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(stage + (threadIdx.x % kHalf) * 4) : "memory");
      acc += v;
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[st]);
      if (rw == 0 && it + kStages < kTiles) {
        ptx::mbar_wait_spin(&empty[st], (it / kStages) & 1);
        issue(it + kStages);
      }
    }
  }
  __syncthreads();  // attn2: the first half may still read the last stage
  if ((kFlags & (kPush | kClusterMerge)) && !(kFlags & kEarlyArrive)) ptx::cluster_arrive_relaxed();
  float4* xchg = reinterpret_cast<float4*>(smem + a2::kExchangeOffset);
  a2::SoftmaxState st;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    st.o[n][0] = acc + n;
    st.o[n][1] = acc - n;
    st.o[n][2] = acc * n;
    st.o[n][3] = acc + threadIdx.x;
  }
  st.m[0] = acc;
  st.m[1] = acc - 1.0f;
  st.l[0] = 1.0f;
  st.l[1] = 2.0f;
  if ((kFlags & kSecondHalfBar) && kh == 1) asm volatile("bar.sync 2, 128;" ::: "memory");
  if (kh == 1) a2::stash_second_half(st, xchg);
  if (kFlags & kExchangeBar3)
    asm volatile("bar.sync 3, 256;" ::: "memory");
  else
    __syncthreads();  // attn2: the second half's state written
  if (kFlags & kPreexit) ptx::griddep_launch_dependents();
  if (kh == 0) {
    a2::merge_second_half(st, xchg);
#pragma unroll
    for (int n = 0; n < 8; ++n) acc += st.o[n][0] + st.o[n][1] + st.o[n][2] + st.o[n][3];
    acc += st.m[0] + st.m[1] + st.l[0] + st.l[1];
  }
  if (kFlags & kTrailingBar) __syncthreads();
  if (kFlags & kPush) {
    ptx::cluster_wait();
    // Every rank gets kRecvBytes / kCluster bytes from each CTA, at this CTA's rank's slot.
    constexpr int kChunks = kRecvBytes / kCluster / 16;
    const uint32_t area = ptx::smem_addr(smem + kRecvOffset);
    if (kh == 0 && threadIdx.x < kChunks) {
      const uint4 v = make_uint4(__float_as_uint(acc), rank, threadIdx.x, 0u);
      for (int d = 0; d < kCluster; ++d)
        ptx::st_async_v4(ptx::map_to_rank(area + (rank * kChunks + threadIdx.x) * 16, d), v,
                         ptx::map_to_rank(ptx::smem_addr(&recv), d));
    }
    if (kh == 0) {
      ptx::mbar_wait_spin(&recv, 0);
      for (int c = threadIdx.x; c < kRecvBytes / 16; c += kHalf)
        acc += __uint_as_float(reinterpret_cast<const uint4*>(smem + kRecvOffset)[c].x);
    }
  }
  if (kFlags & kClusterMerge) {  // attn2's cluster merge itself (from registers in clusters of 16)
    const a2::RowOwner<kCluster> rows(rank);
    a2::ClusterMerge<kCluster> cluster;
    __half* merge_o = reinterpret_cast<__half*>(smem);
    __shared__ float4 s_mls[a2::kRows];
    if (kh == 0) cluster.encode(st, rw, lane, merge_o, s_mls);
    if (!a2::RowOwner<kCluster>::kRegPush) __syncthreads();
    ptx::cluster_wait();
    cluster.push(static_cast<int>(rank), rw, kh, lane, ptx::smem_addr(smem + kRecvOffset), ptx::smem_addr(&recv),
                 merge_o, s_mls);
    if (rows.merger) {
      ptx::mbar_wait_spin(&recv, 0);
      a2::MergedRow<a2::RowOwner<kCluster>::kCols> row;
      cluster.combine(rows, smem + kRecvOffset, row);
      acc += row.l + row.m + row.o[0];
    }
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

// ---- synccheck calibration -------------------------------------------------------------
// A barrier armed for bytes that never come: kClose completes them itself
// (mbarrier.complete_tx); otherwise the CTA exits with the phase open.
template <bool kClose>
__global__ void __launch_bounds__(kThreads) armed_exit(int* out) {
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_mbarrier_init();
    ptx::mbar_arrive_expect_tx(&bar, 9216);
  }
  __syncthreads();
  if (threadIdx.x == 0 && kClose) ptx::mbar_complete_tx(&bar, 9216);
  if (threadIdx.x == 0) out[blockIdx.x] = 1;
}

// ---- qkv_front's split cluster barrier -------------------------------------------------
// Every thread arrives (relaxed); warp 0 waits and writes. kAllWait: the
// other warps wait too before they exit, else they exit between arrival and
// wait, which the PTX ISA allows (a wait waits for the non-exited threads).
template <bool kAllWait>
__global__ void __launch_bounds__(kThreads) split_arrival(int* out, bool rank0_exits) {
  ptx::cluster_arrive_relaxed();
  if (rank0_exits && ptx::cluster_ctarank() == 0) return;  // rank 0 leaves without waiting
  if (threadIdx.x >= 32) {
    if (kAllWait) ptx::cluster_wait();
    return;
  }
  ptx::cluster_wait();
  out[blockIdx.x * 32 + threadIdx.x] = static_cast<int>(threadIdx.x);
}

// ---- host ---------------------------------------------------------------------------------
bool ok(int err, const char* what) {
  if (err != 0) std::printf("%s: launch failed: %s\n", what, cudaGetErrorString(static_cast<cudaError_t>(err)));
  return err == 0;
}

template <int kCluster, int kFlags>
bool run_exchange(const CUtensorMap& map, float* out, const char* what, int ctas = 64) {
  constexpr auto kernel = exchange<kCluster, kFlags>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynSmem) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
          cudaSuccess ||
      (kCluster > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    std::printf("%s: attributes refused\n", what);
    return false;
  }
  // By default attn2's one-slice launch at TP8 (2 KV heads, 2 requests) in
  // clusters of 16: 64 CTAs, the most synccheck runs (docs/sanitizers.md).
  const LaunchShape shape{dim3(ctas), dim3(kThreads), kDynSmem, kCluster};
  const bool launched = ok(launch_kernel<kernel>(shape, nullptr, map, out), what);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%-40s %s\n", what, launched ? cudaGetErrorString(e) : "not launched");
  return launched && e == cudaSuccess;
}

// The exchange patterns' buffers: out (a word per thread of up to kMaxCtas
// CTAs) and the source of the ring's boxes, with its tensor map.
struct ExchangeBuffers {
  float* out = nullptr;
  uint16_t* src = nullptr;
  CUtensorMap map;
  bool ready = false;
  ExchangeBuffers() {
    const size_t rows = 2 * kTiles * kBoxRows;
    if (cudaMalloc(&out, kMaxCtas * kThreads * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&src, rows * 64 * sizeof(uint16_t)) != cudaSuccess)
      return;
    cudaMemset(src, 0, rows * 64 * sizeof(uint16_t));
    ready = muse_decode::tma::encode(&map, muse_decode::tma::bf16_rows(src, static_cast<int64_t>(rows), 64, 64, kBoxRows,
                                                                       muse_decode::tma::kPagePromotion));
    if (!ready) std::printf("tensor map refused\n");
  }
  ~ExchangeBuffers() {
    cudaFree(out);
    cudaFree(src);
  }
};

int race() {
  ExchangeBuffers b;
  if (!b.ready) return 1;
  const CUtensorMap& map = b.map;
  float* out = b.out;
  bool good = true;
  uint32_t* words = reinterpret_cast<uint32_t*>(out);
  good &= ok(launch_kernel<route_publish>(LaunchShape{dim3(kRouteCtas), dim3(kThreads), 0, kRouteCtas}, nullptr, words),
             "route_publish");
  const cudaError_t e = cudaDeviceSynchronize();
  good &= e == cudaSuccess;
  std::printf("%-40s %s\n", "route_publish", cudaGetErrorString(e));
  good &= run_exchange<16, 0>(map, out, "exchange<16, 0>");
  good &= run_exchange<16, kPreexit>(map, out, "exchange<16, kPreexit>");
  good &= run_exchange<16, kPreexit | kTrailingBar>(map, out, "exchange<16, kPreexit | kTrailingBar>");
  good &= run_exchange<16, kRing | kPreexit>(map, out, "exchange<16, kRing | kPreexit>");
  good &= run_exchange<16, kRing | kPreexit | kPush>(map, out, "exchange<16, kRing | kPreexit | kPush>");
  good &= run_exchange<16, kRing | kPreexit | kPush | kTrailingBar>(map, out,
                                                                  "exchange<16, kRing | kPreexit | kPush | kTrailingBar>");
  good &= run_exchange<8, kRing | kPreexit | kPush>(map, out, "exchange<8, kRing | kPreexit | kPush>");
  good &= run_exchange<16, kRing | kPreexit | kHalfTail>(map, out, "exchange<16, kRing | kPreexit | kHalfTail>");
  good &= run_exchange<16, kRing | kPreexit | kPush | kHalfTail>(map, out,
                                                               "exchange<16, kRing | kPreexit | kPush | kHalfTail>");
  good &= run_exchange<16, kRing | kPreexit | kPush | kLeave>(map, out, "exchange<16, kRing | kPreexit | kPush | kLeave>");
  good &= run_exchange<16, kRing | kClusterMerge>(map, out, "exchange<16, kRing | kClusterMerge>");
  good &= run_exchange<16, kRing | kClusterMerge | kEarlyArrive>(map, out,
                                                                 "exchange<16, kRing | kClusterMerge | kEarlyArrive>");
  good &= run_exchange<8, kRing | kClusterMerge | kEarlyArrive>(map, out, "exchange<8, kRing | kClusterMerge | kEarlyArrive>");
  good &= run_exchange<16, kSecondHalfBar>(map, out, "exchange<16, kSecondHalfBar>");
  good &= run_exchange<8, kSecondHalfBar>(map, out, "exchange<8, kSecondHalfBar>");
  good &= run_exchange<16, kRing | kHalfTailSecond>(map, out, "exchange<16, kRing | kHalfTailSecond>");
  good &= run_exchange<16, kRing | kHalfTailSecond | kClusterMerge>(map, out,
                                                                    "exchange<16, kRing | kHalfTailSecond | kClusterMerge>");
  std::printf("sanitizer_patterns race: %s\n", good ? "ran" : "FAILED");
  return good ? 0 : 1;
}

// The exchange variants of `sanitizer_patterns variant K`, one launch each:
// the two that draw racecheck's report and ways of writing the tail's
// warpgroup barrier or the exchange's CTA barrier that might not.
constexpr const char* variant_names[] = {
    "exchange<16, kRing | kHalfTailSecond>",
    "exchange<16, kRing | kHalfTailSecond | kTailBarrier1>",
    "exchange<16, kRing | kHalfTailSecond | kTailMbarrier>",
    "exchange<16, kRing | kHalfTailSecond | kExchangeBar3>",
    "exchange<16, kRing | kTailMbarrier>",
    "exchange<16, kRing | kHalfTailSecond | kTailMbarrier | kClusterMerge>",
};
int variant(int k) {
  ExchangeBuffers b;
  if (!b.ready) return 1;
  const char* what = k >= 0 && k < 6 ? variant_names[k] : "";
  bool good = false;
  switch (k) {
    case 0: good = run_exchange<16, kRing | kHalfTailSecond>(b.map, b.out, what); break;
    case 1: good = run_exchange<16, kRing | kHalfTailSecond | kTailBarrier1>(b.map, b.out, what); break;
    case 2: good = run_exchange<16, kRing | kHalfTailSecond | kTailMbarrier>(b.map, b.out, what); break;
    case 3: good = run_exchange<16, kRing | kHalfTailSecond | kExchangeBar3>(b.map, b.out, what); break;
    case 4: good = run_exchange<16, kRing | kTailMbarrier>(b.map, b.out, what); break;
    case 5: good = run_exchange<16, kRing | kHalfTailSecond | kTailMbarrier | kClusterMerge>(b.map, b.out, what); break;
    default: std::printf("variant: 0 .. 5, not %d\n", k); return 2;
  }
  return good ? 0 : 1;
}

// One launch of the exchange in clusters of C over `ctas` CTAs, with or
// without the ring: whether a tool's run depends on the cluster size or on
// clusters placed in later waves (an H200 holds 224 CTAs of it in clusters of
// 16 and 240 in clusters of 8). One launch per process: a fault ends the
// context.
int waves(int cluster, int ctas, bool ring) {
  ExchangeBuffers b;
  if (cluster != 8 && cluster != 16) {
    std::printf("waves: clusters of 8 or 16, not %d\n", cluster);
    return 2;
  }
  if (!b.ready || ctas < cluster || ctas > kMaxCtas || ctas % cluster != 0) return 1;
  char what[64];
  std::snprintf(what, sizeof what, "exchange<%d, %s> x %d CTAs", cluster, ring ? "kRing" : "0", ctas);
  bool good;
  if (cluster == 16)
    good = ring ? run_exchange<16, kRing>(b.map, b.out, what, ctas) : run_exchange<16, 0>(b.map, b.out, what, ctas);
  else
    good = ring ? run_exchange<8, kRing>(b.map, b.out, what, ctas) : run_exchange<8, 0>(b.map, b.out, what, ctas);
  return good ? 0 : 1;
}

template <bool kClose>
int armed() {
  int* out = nullptr;
  if (cudaMalloc(&out, 64 * sizeof(int)) != cudaSuccess) return 1;
  armed_exit<kClose><<<64, kThreads>>>(out);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("armed_exit<%s>: %s\n", kClose ? "true" : "false", cudaGetErrorString(e));
  cudaFree(out);
  return e == cudaSuccess ? 0 : 1;
}

}  // namespace

template <bool kAllWait>
int split(int clusters, bool rank0_exits = false) {
  int* out = nullptr;
  if (cudaMalloc(&out, clusters * 3 * 32 * sizeof(int)) != cudaSuccess) return 1;
  const char* what = kAllWait ? "split_arrival<all wait>" : "split_arrival<warp 0 waits>";
  bool good = ok(launch_kernel<split_arrival<kAllWait>>(LaunchShape{dim3(3 * clusters), dim3(kThreads), 0, 3}, nullptr, out,
                                                               rank0_exits),
                 what);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%-40s %s\n", what, cudaGetErrorString(e));
  cudaFree(out);
  return good && e == cudaSuccess ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "race";
  if (std::strcmp(mode, "race") == 0) return race();
  if (std::strcmp(mode, "open") == 0) return armed<false>();
  if (std::strcmp(mode, "closed") == 0) return armed<true>();
  if (std::strcmp(mode, "unwaited") == 0) return split<false>(36);
  if (std::strcmp(mode, "rank0_exits") == 0) return split<true>(36, true);
  if (std::strcmp(mode, "variant") == 0 && argc == 3) return variant(std::atoi(argv[2]));
  if (std::strcmp(mode, "waves") == 0 && argc == 5)
    return waves(std::atoi(argv[2]), std::atoi(argv[3]), std::strcmp(argv[4], "ring") == 0);
  std::printf("usage: %s race | open | closed | unwaited | rank0_exits | variant K | waves CLUSTER CTAS plain|ring\n",
              argv[0]);
  return 2;
}
