// qkv_front's kernels: y = x W^T for 1..16 tokens, q/k RMS norm, interleaved
// RoPE and the paged KV-cache insert in one launch (docs/contract.md). One
// source serves sm_90a and sm_100a (TMA, mbarrier, mma.sync, clusters, PDL).
//
// The cost is reading the weight once (TP8: 37.7 MB, 9.0 us at 4.2 TB/s);
// the math is 0.6 GFLOP at T = 16, so everything is arranged around the
// stream of weight bytes: a producer thread per CTA keeps a ring of 8 KB
// weight blocks in flight (pipeline.cuh), 4 consumer warps multiply them
// (mainloop.cuh), a head split over several CTAs is merged in K order
// (merge.cuh), and its owner runs the epilogue (epilogue.cuh). Which CTA
// streams which blocks: schedule.cuh; the shapes and constants: config.cuh.
//
// Two kernels, chosen per KV-head count (path_for):
// - Cluster kernel (2 KV heads, TP8: 36 heads): a thread-block cluster of 3
//   CTAs per head (108 CTAs, one wave), each CTA one slice of K, merged
//   through distributed shared memory by the head's owner. It takes the whole
//   SM for a ring of 21-24 stages. H200, graph replay with PDL: 9.8-10.1 us
//   for T = 1..16.
// - Stream-K kernel (every other count; TP1 and its 288 heads): one CTA per
//   SM over all heads' blocks, merged through the workspace. Under 113 KB of
//   shared memory, so the next launch's CTA fits beside it and streams its
//   own weight early. H200, TP1: 72.4-74.1 us (the weight-read floor 71.9).
// Both merge in a fixed order, so the bits do not depend on timing.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tensor_map.h"
#include "../common/trace.cuh"
#include "config.cuh"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "merge.cuh"
#include "pipeline.cuh"
#include "params.h"
#include "schedule.cuh"

namespace muse_decode::qkv_front_impl {

MUSE_DECODE_TRACE_RING(qkv_front_trace)
static_assert(static_cast<int>(Phase::kExit) < trace::kStampWords, "every phase has a stamp word");

namespace {

// ---------------------------------------------------------------------------
// Stream-K kernel. NT: n-tiles of 8 tokens (1 for T <= 8, 2 for T <= 16).
template <int NT>
__global__ void __launch_bounds__(kThreads, StreamKLayout::kCtasPerSm)
    qkv_front_streamk_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                             const Params p) {
  using Layout = StreamKLayout;
  trace::Recorder<Phase> trace(qkv_front_trace());
  trace.tag(gridDim.x);
  extern __shared__ uint8_t smem_raw[];
  constexpr uintptr_t kAlign = swizzle::kAtomBytes;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + kAlign - 1) & ~(kAlign - 1));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Layout::kBarrierOffset);
  const Ring<Layout::kStages, Layout::kStageBytes> ring{ptx::smem_addr(smem), full, full + Layout::kStages};
  const EpilogueSmem epi{reinterpret_cast<float*>(smem + Layout::kYOffset), reinterpret_cast<float*>(smem + Layout::kRopeOffset),
                         reinterpret_cast<int64_t*>(smem + Layout::kSlotOffset), full + 2 * Layout::kStages};
  int* s_last = reinterpret_cast<int*>(epi.staged + 1);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const StreamKWork work = StreamKWork::of_this_cta(p.num_kv_heads);

  if (threadIdx.x == 0) {
    ring.init(kConsumerWarps);
    ptx::mbar_init(epi.staged, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // The next kernel may start as soon as every CTA is here: its reads before
  // its griddepcontrol.wait are of what no kernel of a step writes (its own
  // weights; attn2: lengths, block tables, keys older than the step's), and
  // the wait then waits for all of this grid.
  ptx::griddep_launch_dependents();
  trace.mark(Phase::kInitSynced);

  if (warp == kStagingWarp) {
    stage_epilogue_inputs(p, epi, lane);
    return;
  }
  if (warp == kProducerWarp) {
    const auto block_at = [&](int i) {  // the blocks are numbered tile-major
      const int64_t b = work.begin + i;
      return BlockCoord{static_cast<int>(b % kFrontBlocksPerTile), static_cast<int>(b / kFrontBlocksPerTile)};
    };
    if (lane == 0)
      produce<Layout::kEarlyStages>(ring, &w_map, &x_map, kStageCopyBytes<NT>, static_cast<int>(work.end - work.begin),
                               block_at);
    return;
  }

  // ---- consumers: segment by segment (one tile's blocks each) ----
  ptx::griddep_wait();  // positions, slots and every write below
  trace.mark(Phase::kWaited);
  const FragRows rows = FragRows::of(warp, lane);
  const WorkspaceMerge<NT> merge(p.workspace, work.tiles);
  pipeline::Position<Layout::kStages> at;
  bool inputs_staged = false;
  int64_t b = work.begin;
  while (b < work.end) {
    const Segment seg = Segment::at(b, work.end);
    Chains<NT, kStreamKChains> chains;
    zero_chains(chains);
    mma_blocks<Release::kAfterMma>(chains, ring, at, b, seg.end, rows, lane);  // b = seg.end after it
    float acc[NT][4];
    sum_chains(chains, acc);
    if (!seg.whole && !merge.sum_if_last(acc, work, seg, s_last, threadIdx.x)) continue;
    head_epilogue<NT>(acc, epi, inputs_staged, seg.tile, p, warp, lane);
  }
  trace.mark(Phase::kExit);
}

// ---------------------------------------------------------------------------
// Cluster kernel: one cluster of kClusterCtas CTAs per head (cluster id =
// head), rank r streaming ClusterSplit's slice r of K; rank 0, the owner,
// merges and runs the epilogue.
template <int NT>
__global__ void __launch_bounds__(kThreads, ClusterLayout<NT>::kCtasPerSm)
    qkv_front_cluster_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                             const Params p) {
  using Layout = ClusterLayout<NT>;
  using Split = ClusterSplit<NT>;
  trace::Recorder<Phase> trace(qkv_front_trace());
  trace.tag(gridDim.x);
  // 1024-byte alignment of the dynamic shared memory (the 128-byte swizzle's
  // period), checked at entry.
  extern __shared__ __align__(swizzle::kAtomBytes) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Layout::kBarrierOffset);
  const Ring<Layout::kStages, Layout::kStageBytes> ring{ptx::smem_addr(smem), full, full + Layout::kStages};
  float* const slots = reinterpret_cast<float*>(smem + Layout::kMergeOffset);
  const EpilogueSmem epi{slots /* the epilogue tile reuses the merge slots once summed */,
                         reinterpret_cast<float*>(smem + Layout::kRopeOffset),
                         reinterpret_cast<int64_t*>(smem + Layout::kSlotOffset), full + 2 * Layout::kStages};
  const ClusterMerge<NT> merge{slots, epi.staged + 1};

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = ptx::cluster_ctarank();
  const int head = static_cast<int>(ptx::cluster_id_x());
  const typename Split::Slice slice = Split::of_rank(rank);

  if (threadIdx.x == 0) {
    if (ptx::smem_addr(smem) % swizzle::kAtomBytes != 0) __trap();  // the swizzle addressing needs it
    ring.init(kConsumerWarps);
    ptx::mbar_init(epi.staged, 1);
    ptx::mbar_init(merge.merged, 1);
    // The owner's own arrival, expecting the others' partials.
    if (rank == 0) ptx::mbar_arrive_expect_tx(merge.merged, (kClusterCtas - 1) * Layout::kPartialBytes);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // Split cluster barrier: every thread arrives here, all 32 lanes of each
  // warp together (.aligned). A rank's consumers wait before their first
  // access to the owner's shared memory (ClusterMerge::push), the owner's
  // before the merge, where the phase has long completed; the producer and
  // staging warps exit without waiting, which the PTX ISA allows (a wait
  // waits for the non-exited threads). The owner's wait costs nothing and is
  // there for compute-sanitizer: without it racecheck never finishes the
  // launch (docs/sanitizers.md); waiting in the exiting warps too would cost
  // the TP8 block 0.2 us (H200). The arrival is relaxed: all it publishes
  // is the barrier inits, which fence_mbarrier_init released; the release
  // form is a MEMBAR.ALL.GPU per thread in front of the first copies (H200,
  // TP8: 0.15-0.2 us from T = 9 on).
  ptx::cluster_arrive_relaxed();
  ptx::griddep_launch_dependents();  // as in the stream-K kernel
  trace.mark(Phase::kInitSynced);

  if (warp == kStagingWarp) {
    if (rank == 0) stage_epilogue_inputs(p, epi, lane);
    return;
  }
  if (warp == kProducerWarp) {
    const auto block_at = [&](int i) { return BlockCoord{slice.begin + i, head}; };
    if (lane == 0)
      produce<Layout::kEarlyStages>(ring, &w_map, &x_map, kStageCopyBytes<NT>, slice.end - slice.begin, block_at);
    return;
  }

  // ---- consumers ----
  ptx::griddep_wait();  // positions, slots and every write below
  trace.mark(Phase::kWaited);
  const FragRows rows = FragRows::of(warp, lane);
  Chains<NT, kClusterChains> chains;
  zero_chains(chains);
  pipeline::Position<Layout::kStages> at;
  int b = slice.begin;
  mma_blocks<Release::kInRegisters>(chains, ring, at, b, slice.end, rows, lane);
  trace.mark(Phase::kLoopDone);
  float acc[NT][4];
  sum_chains(chains, acc);
  if (rank != 0) {
    merge.push(acc, rank, threadIdx.x);  // whole consumer warps (rank is the CTA's)
    trace.mark(Phase::kExit);
    return;
  }
  ptx::cluster_wait();  // the owner too (see the arrival)
  merge.add(acc, threadIdx.x);
  bool inputs_staged = false;
  head_epilogue<NT>(acc, epi, inputs_staged, head, p, warp, lane);
  trace.mark(Phase::kExit);
}

// ---------------------------------------------------------------------------
// Host side: tensor maps, the launches and the dispatch table.

// The launch's two maps, from this thread's table (src/common/tensor_map.h):
// W in boxes of one head's 64 rows, x in boxes of NT * 8 token rows (the
// rows past T zero-filled). A layer's weight always hits the table, x when
// the allocator hands back its buffer.
struct MapSite {};
template <int NT>
bool make_maps(const Params& p, CUtensorMap* w_map, CUtensorMap* x_map) {
  return tma::cached<MapSite, 8>(w_map, tma::bf16_rows(p.weight, qkv_width(p.num_kv_heads), kHiddenSize,
                                                       kHiddenSize, kFrontTileRows)) &&
         tma::cached<MapSite, 8>(x_map, tma::bf16_rows(p.x, p.num_tokens, kHiddenSize, p.x_stride, NT * 8));
}

template <int NT>
cudaError_t launch_streamk(const Params& p, cudaStream_t stream) {
  CUtensorMap w_map, x_map;
  if (!make_maps<NT>(p, &w_map, &x_map)) return cudaErrorInvalidValue;
  const detail::LaunchShape shape{dim3(p.num_ctas), dim3(kThreads), StreamKLayout::kSmemBytes, 0, p.pdl};
  return static_cast<cudaError_t>(
      detail::launch_kernel<qkv_front_streamk_kernel<NT>>(shape, stream, w_map, x_map, p));
}

template <int NT>
cudaError_t launch_cluster(const Params& p, cudaStream_t stream) {
  CUtensorMap w_map, x_map;
  if (!make_maps<NT>(p, &w_map, &x_map)) return cudaErrorInvalidValue;
  const int heads = qkv_width(p.num_kv_heads) / kFrontTileRows;
  const detail::LaunchShape shape{dim3(heads * kClusterCtas), dim3(kThreads),
                                  static_cast<unsigned>(ClusterLayout<NT>::kSmemBytes), kClusterCtas, p.pdl};
  return static_cast<cudaError_t>(
      detail::launch_kernel<qkv_front_cluster_kernel<NT>>(shape, stream, w_map, x_map, p));
}

// Which kernel serves a KV-head count: the cluster kernel where one cluster
// per head fills the GPU in one wave (2 KV heads: 36 heads x 3 CTAs = 108),
// stream-K elsewhere (1 KV head: 18 x 3 = 54 CTAs would leave half the SMs
// idle; 4 and more: enough heads that the stream-K merge is a small part).
enum class Path { kStreamK, kCluster };
Path path_for(int num_kv_heads) {
  switch (num_kv_heads) {
    case 2: return Path::kCluster;
    default: return Path::kStreamK;
  }
}

}  // namespace

int set_kernel_attributes() {
  if (!tma::encoder_available()) return static_cast<int>(cudaErrorNotSupported);
  cudaError_t err = detail::set_smem_limit<qkv_front_streamk_kernel<1>>(StreamKLayout::kSmemBytes);
  if (err == cudaSuccess) err = detail::set_smem_limit<qkv_front_streamk_kernel<2>>(StreamKLayout::kSmemBytes);
  if (err == cudaSuccess) err = detail::set_smem_limit<qkv_front_cluster_kernel<1>>(ClusterLayout<1>::kSmemBytes);
  if (err == cudaSuccess) err = detail::set_smem_limit<qkv_front_cluster_kernel<2>>(ClusterLayout<2>::kSmemBytes);
  return static_cast<int>(err);
}

int launch(const Params& p, Stream stream) {
  // The table has no kernel for other token counts, and stream-K needs its workspace.
  if (p.num_tokens < 1 || p.num_tokens > kFrontMaxTokens || p.num_ctas < 1 || p.workspace == nullptr)
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  // Flat dispatch: kernel by KV-head count, then 8 tokens (the verify step)
  // and fewer take one n-tile.
  const bool one_tile = p.num_tokens <= 8;
  cudaError_t err;
  switch (path_for(p.num_kv_heads)) {
    case Path::kCluster: err = one_tile ? launch_cluster<1>(p, s) : launch_cluster<2>(p, s); break;
    default: err = one_tile ? launch_streamk<1>(p, s) : launch_streamk<2>(p, s); break;
  }
  return static_cast<int>(err);
}

}  // namespace muse_decode::qkv_front_impl
