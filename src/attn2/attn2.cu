// attn2's kernel: the 64 query rows (8 tokens x 8 heads) of one (request, KV
// head) against its paged keys, with the o-norm and sigmoid gate fused
// (docs/contract.md), composed of its parts:
//   config.cuh          the shape, the shared-memory plan, the named phases
//   schedule.cuh        which CTA and warpgroup takes which keys
//   rows.cuh            the rows each thread merges and finishes, Q and gate loads
//   mainloop_sm90.cuh   the key loop on sm_90a: TMA loads, wgmma S and P V
//   mainloop_mma.cuh    the key loop with mma.sync (sm_100a)
//   softmax.cuh         the online-softmax state
//   merge.cuh           the key halves', the cluster's and the split merges
//   workspace.cuh       the split merge's self-marking partials
//   epilogue.cuh        o-norm, gate, bf16 store
// and the host side of the launch: the cache's tensor map, the kernel
// instances, their attributes and occupancy.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tensor_map.h"
#include "../common/trace.cuh"
#include "config.cuh"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "mainloop_mma.cuh"
#include "mainloop_sm90.cuh"
#include "merge.cuh"
#include "params.h"
#include "rows.cuh"
#include "schedule.cuh"
#include "softmax.cuh"
#include "workspace.cuh"

namespace muse_decode::attn2_impl {

MUSE_DECODE_TRACE_RING(attn2_trace)
static_assert(static_cast<int>(Phase::kExit) < trace::kStampWords, "every phase has a stamp word");

namespace {

// kOneSlice: the launch has one slice (num_splits 1), so the split merge is
// compiled out. kWindow: the launch may have a window; false only for
// one-slice launches without one (max_model_len <= 2048), whose kernel has
// neither the window's masks nor its odd tile (3.41 us against 3.61 at TP8
// max_model_len 2048; the split kernel's counterpart measured within noise).
template <int kCluster, bool kOneSlice, bool kWindow>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attn2_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  using Mainloop =
      std::conditional_t<kWgmma, MainloopSm90<kCluster, kOneSlice, kWindow>, MainloopMma<kCluster, kOneSlice>>;
  using Rows = RowOwner<kCluster>;
  constexpr int kCols = Rows::kCols;
  static_assert(is_mainloop<Mainloop, kCluster>::value, "a key loop implements mainloop.cuh's interface");

  extern __shared__ __align__(128) uint8_t smem[];  // the stages; after the key loop the merge areas
  __shared__ uint64_t full_bar[kBarriers];
  __shared__ uint64_t empty_bar[kBarriers];
  __shared__ uint64_t tail_bar[kKeyHalves];
  __shared__ float4 s_mls[kRows];             // per row: m (log2 domain), l, 2^e of its fp16 O
  __shared__ int s_bad;                       // a page id outside the cache: the rows come out NaN
  __shared__ uint64_t recv_bar;               // the cluster merge: every rank's rows of this CTA landed
  __shared__ uint2 s_gate[kHalfThreads];      // the merger threads' gate (no registers held through the loop)

  trace::Recorder<Phase> trace(attn2_trace());
  const int rank = static_cast<int>(blockIdx.x) % kCluster;
  const int req = blockIdx.z;
  const int lane = threadIdx.x % 32, rw = threadIdx.x / 32 % kRowWarps, kh = threadIdx.x / 32 / kRowWarps;
  const MainloopSetup setup{&kv_map, p, smem, full_bar, empty_bar, tail_bar, kWindow ? p.window : 0, req};
  Mainloop loop(setup);
  if (threadIdx.x == 0) {
    Mainloop::init_barriers(setup);
    s_bad = 0;
    ptx::mbar_init(&recv_bar, 1);
    ptx::fence_mbarrier_init();
    // Phase 0 ends when every rank's rows landed. The split kernel arms it
    // once start() says this CTA receives (below).
    if (kOneSlice) ptx::mbar_arrive_expect_tx(&recv_bar, kRecvBytes);
  }
  __syncthreads();
  trace.mark(Phase::kInitSynced);

  // ---- before the key loop: L, the schedule, the first copies, Q and the gate ----
  const Rows rows(rank);
  SoftmaxState st;
  st.init();
  RowInputs<kCluster> in;
  const Deployment dep{p.num_splits, p.num_kv_heads, p.num_reqs, p.idle_last, gridDim.z == 1};
  if (!loop.start(in, rows, dep, static_cast<int>(blockIdx.x) / kCluster, blockIdx.y, rank, req, trace)) {
    // The whole cluster leaves (a split launch's slice past the active ones):
    // it shares nothing with the others, no rank pushes into this CTA, and
    // its receive barrier holds its init only (no arrival, nothing pending).
    trace.mark(Phase::kExit);
    return;
  }
  // (Split kernel) this CTA receives: thread 0 arms the receive barrier. The
  // phase cannot complete before this arrival, so pushes that land first
  // (early_push: the other ranks may push once their short loops are done)
  // only take the transaction count below zero until it.
  if (!kOneSlice && threadIdx.x == 0) ptx::mbar_arrive_expect_tx(&recv_bar, kRecvBytes);
  loop.stage_q(in.q);
  if (rows.merger) s_gate[threadIdx.x] = in.gate;
  loop.publish_q();
  __syncthreads();
  trace.mark(Phase::kQStaged);

  // ---- the key loop ----
  loop.run(st, trace);

  // ---- the key halves' merge ----
  if (loop.bad_page()) s_bad = 1;
  __syncthreads();  // the first half may still read the last stage
  // Every stage consumed: the receive area may be written (merge.cuh: why
  // relaxed). Where every loop is short it was before the loop (early_push).
  if (!loop.early_push()) ptx::cluster_arrive_relaxed();
  float4* xchg = reinterpret_cast<float4*>(smem + kExchangeOffset);
  if (kh == 1) stash_second_half(st, xchg);
  __syncthreads();  // s_bad set, the second half's state written
  trace.mark(Phase::kHalvesDone);
  ptx::griddep_launch_dependents();
  if (kh == 0) merge_second_half(st, xchg);

  // ---- the cluster merge ----
  ClusterMerge<kCluster> cluster;
  __half* merge_o = reinterpret_cast<__half*>(smem);
  if (kh == 0) {
    if (loop.broken() || s_bad != 0) st.l[0] = st.l[1] = NAN;  // a contract break: the rows come out NaN
    cluster.encode(st, rw, lane, merge_o, s_mls);
  }
  trace.mark(Phase::kStateStored);
  if (!Rows::kRegPush) __syncthreads();  // this CTA's rows (fp16 O, m, l, 2^e) all in shared memory
  ptx::cluster_wait();                    // every CTA of the cluster past its key loop
  trace.mark(Phase::kClusterSynced);
  cluster.push(rank, rw, kh, lane, ptx::smem_addr(smem + kRecvOffset), ptx::smem_addr(&recv_bar), merge_o, s_mls);
  // The gate's sigmoid while the merges are in flight where every loop is
  // short, else after them (computed here at long L it made TP8 128k 0.6 us
  // slower, 32k 0.15).
  const bool gate_early = kOneSlice || loop.early_push();
  float sg[kCols];
  if (gate_early && rows.merger) gate_sigmoid(s_gate[threadIdx.x], sg);
  MergedRow<kCols> row;  // this thread's columns of its row, merged over the cluster
  if (rows.merger) {
    ptx::mbar_wait_spin(&recv_bar, 0);
    cluster.combine(rows, smem + kRecvOffset, row);
  }
  trace.mark(Phase::kClusterMerged);
  const int kvh = loop.kv_head();
  __nv_bfloat16* out = rows.out(p, req, kvh);
  const int active = loop.active();
  if (active == 1) {
    if (rows.merger) {
      if (!gate_early) gate_sigmoid(s_gate[threadIdx.x], sg);
      finish_row<Rows::kRowThreads>(row.o, row.l, sg, out);
    }
    trace.mark(Phase::kExit);
    return;
  }

  // ---- the split merge: per CTA rank, one slice merges that rank's rows
  // over all slices (with p.resident the last one, else the last ticket) ----
  const int split = loop.slice();
  const SplitWorkspace ws(p, req, kvh, rank);
  const SplitMerge<kCols> merge{ws, active, split, rows.row, rows.d};
  const bool fixed = p.resident;
  if (rows.merger && !(fixed && split == active - 1)) merge.publish(row);  // (the merger keeps its own)
  trace.mark(Phase::kPartialStored);
  trace.tag(split | kvh << 8 | rank << 24);
  const bool last = fixed ? split == active - 1 : merge.last_ticket();
  trace.mark(Phase::kTicket);
  if (!last || !rows.merger) {
    trace.mark(Phase::kExit);
    return;
  }
  const MergedRow<kCols> all = merge.merge(row);
  trace.mark(Phase::kMerged);
  if (!gate_early) gate_sigmoid(s_gate[threadIdx.x], sg);
  finish_row<Rows::kRowThreads>(all.o, all.l, sg, out);
  trace.mark(Phase::kExit);
}

// ---------------------------------------------------------------------------
// Host side: the cache's tensor map and the launches.

// The cache [pages, KVH, 16, 128] as 5-D (64 elements, K|V, key, KV head,
// page), read in boxes of one page's K or V of one KV head (16 x 64, 2 KB),
// 128-byte swizzled. The map depends only on (address, pages, KV heads): a
// layer's cache hits this thread's table (src/common/tensor_map.h) after its
// first call.
struct MapSite {};
bool kv_map(CUtensorMap* map, const Params& p) {
  const auto kvh = static_cast<cuuint64_t>(p.num_kv_heads);
  return tma::cached<MapSite, 6>(
      map, tma::bf16_tiled<5>(p.kv_cache, {kHeadDim, 2, kPageSize, kvh, static_cast<cuuint64_t>(p.num_pages)},
                              {kHeadDim * 2, kKeyBytes, kPageBytes, kvh * kPageBytes}, {kHeadDim, 1, kPageSize, 1, 1},
                              tma::kPagePromotion));
}

// The kernel instances, per cluster size: one slice without a window, one
// slice (with a window), several slices.
enum class Variant { kOneSliceNoWindow, kOneSlice, kSplit };
Variant variant_of(const Params& p) {
  if (p.num_splits > 1) return Variant::kSplit;
  return p.window == 0 ? Variant::kOneSliceNoWindow : Variant::kOneSlice;
}

template <int kCluster>
detail::LaunchShape launch_shape(const Params& p) {
  return {dim3(p.num_splits * kCluster, p.num_kv_heads, p.num_reqs), dim3(kThreads), kDynSmemBytes, kCluster, p.pdl};
}

template <int kCluster>
int launch_cluster(const Params& p, cudaStream_t stream) {
  CUtensorMap map;
  if (!kv_map(&map, p)) return cudaErrorInvalidValue;
  const detail::LaunchShape shape = launch_shape<kCluster>(p);
  switch (variant_of(p)) {
    case Variant::kOneSliceNoWindow:
      return detail::launch_kernel<attn2_kernel<kCluster, true, false>>(shape, stream, map, p);
    case Variant::kOneSlice:
      return detail::launch_kernel<attn2_kernel<kCluster, true, true>>(shape, stream, map, p);
    case Variant::kSplit:
      return detail::launch_kernel<attn2_kernel<kCluster, false, true>>(shape, stream, map, p);
  }
  return cudaErrorInvalidValue;
}

template <int kCluster, bool kOneSlice, bool kWindow>
cudaError_t set_attributes_of() {
  constexpr auto kernel = attn2_kernel<kCluster, kOneSlice, kWindow>;
  cudaError_t err = detail::set_smem_limit<kernel>(kDynSmemBytes);
  // The whole unified L1/shared array as shared memory: two CTAs per SM.
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess && kCluster > detail::kPortableClusterSize)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return err;
}
template <int kCluster>
cudaError_t set_attributes() {
  cudaError_t err = set_attributes_of<kCluster, false, true>();
  if (err == cudaSuccess) err = set_attributes_of<kCluster, true, true>();
  if (err == cudaSuccess) err = set_attributes_of<kCluster, true, false>();
  return err;
}

// Co-resident clusters of the split kernel (the largest grid).
template <int kCluster>
int max_active_clusters() {
  const detail::LaunchShape shape{dim3(kCluster), dim3(kThreads), kDynSmemBytes, kCluster};
  cudaLaunchAttribute attr[detail::kMaxLaunchAttributes];
  const cudaLaunchConfig_t config = detail::runtime_config(shape, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, attn2_kernel<kCluster, false, true>, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <int kCluster>
int occupancy_of(int* blocks_per_sm, int* max_clusters) {
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks_per_sm, attn2_kernel<kCluster, false, true>, kThreads, kDynSmemBytes);
  *max_clusters = max_active_clusters<kCluster>();
  return static_cast<int>(err);
}

}  // namespace

int launch(const Params& p, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  switch (p.cluster_size) {
    case 8: return launch_cluster<8>(p, s);
    case 16: return launch_cluster<16>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

int set_kernel_attributes(int* short_cluster_size) {
  cudaError_t err = set_attributes<8>();
  if (err == cudaSuccess) err = set_attributes<16>();
  if (err != cudaSuccess) return static_cast<int>(err);
  // Clusters of 16 are non-portable: take them only where the GPU can place one.
  *short_cluster_size = max_active_clusters<16>() > 0 ? 16 : 8;
  return 0;
}

int occupancy(int cluster_size, int* blocks_per_sm, int* max_clusters) {
  switch (cluster_size) {
    case 8: return occupancy_of<8>(blocks_per_sm, max_clusters);
    case 16: return occupancy_of<16>(blocks_per_sm, max_clusters);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace muse_decode::attn2_impl
