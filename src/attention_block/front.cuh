// The block's front: qkv_front's stream-K loop over fixed shares. Share s of
// kShares takes weight blocks [s B / kShares, (s + 1) B / kShares) of the B =
// tiles x 128 blocks (tile-major, qkv_front's order of heads), so the K
// split of every head, and with it the bits, does not depend on the grid.
// qkv_front's parts do the work: its ring of (weight, x) stages, its
// consumers' mma.sync, its workspace merge of a head split over shares (the
// last share to arrive sums the partials in share order) and its epilogue
// (q/k norm, RoPE, the row of out, the cache insert). After a head's
// epilogue the share counts it ready for its KV head.
//
// Rows go 16 at a time (token groups): each group streams the weight again
// (1 or 2 requests: one group).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/trace.cuh"
#include "../qkv_front/config.cuh"
#include "../qkv_front/epilogue.cuh"
#include "../qkv_front/mainloop.cuh"
#include "../qkv_front/merge.cuh"
#include "../qkv_front/params.h"
#include "../qkv_front/pipeline.cuh"
#include "../qkv_front/schedule.cuh"
#include "config.cuh"
#include "params.h"

namespace muse_decode::attention_block_impl {

using FrontRing = pipeline::Ring<kFrontStages, kFrontStageBytes>;

inline __device__ int num_tokens(const Params& p) { return p.num_reqs * kVerifyLen; }
inline __device__ int num_groups(const Params& p) { return (num_tokens(p) + kTokenGroup - 1) / kTokenGroup; }
inline __device__ int group_tokens(const Params& p, int g) {
  const int left = num_tokens(p) - g * kTokenGroup;
  return left < kTokenGroup ? left : kTokenGroup;
}
// The projection's heads of 64 rows (qkv_front's tiles): 8 q and 8 gate
// heads per KV head, and its k and v.
inline __device__ int qkv_tiles(const Params& p) { return 2 * (kHeadsPerKvHead + 1) * p.num_kv_heads; }

// Share s's run of the front's blocks, as qkv_front's stream-K work of a grid
// of kShares CTAs.
inline __device__ qkv_front_impl::StreamKWork front_work(const Params& p, int share) {
  qkv_front_impl::StreamKWork w;
  w.tiles = qkv_tiles(p);
  w.blocks = int64_t{w.tiles} * qkv_front_impl::kFrontBlocksPerTile;
  w.ctas = kShares;
  w.cta = share;
  w.begin = share * w.blocks / kShares;
  w.end = (share + 1) * w.blocks / kShares;
  return w;
}

// qkv_front's parameters for token group g: its rows of x, positions and
// slots, its rows of the projection in the workspace.
inline __device__ qkv_front_impl::Params front_params(const Params& p, int g, void* qkv, void* front_ws) {
  qkv_front_impl::Params f;
  const int t0 = g * kTokenGroup;
  f.x = p.x;  // (read through the x maps)
  f.x_stride = p.x_stride;
  f.weight = p.qkv_weight;
  f.positions = p.positions + t0;
  f.cos_sin = p.cos_sin;
  f.max_pos = p.max_pos;
  f.slot_mapping = p.slot_mapping + t0;
  f.kv_cache = p.kv_cache;
  f.num_slots = int64_t{p.num_pages} * kPageSize;
  f.out = static_cast<__nv_bfloat16*>(qkv) + int64_t{t0} * qkv_width(p.num_kv_heads);
  f.out_stride = qkv_width(p.num_kv_heads);
  f.workspace = front_ws;
  f.num_tokens = group_tokens(p, g);
  f.num_kv_heads = p.num_kv_heads;
  f.num_ctas = kShares;
  f.pdl = false;
  return f;
}

// The copying lane: every (group, share, block) of this CTA's shares in the
// consumers' order, into the ring. x's map for groups of 8 rows reads boxes
// of 8 (the last group of an odd request count), for 16 boxes of 16.
struct FrontMaps {
  const CUtensorMap* w;
  const CUtensorMap* x8;
  const CUtensorMap* x16;
};
inline __device__ void produce_front(const FrontRing& ring, const FrontMaps& maps, const Params& p) {
  ptx::prefetch_tensor_map(maps.w);
  ptx::prefetch_tensor_map(maps.x16);
  const uint64_t policy = ptx::evict_first_policy();  // the weight is read once
  pipeline::Position<kFrontStages> at;
  for (int g = 0; g < num_groups(p); ++g) {
    const bool one_tile = group_tokens(p, g) <= 8;
    const CUtensorMap* x_map = one_tile ? maps.x8 : maps.x16;
    const uint32_t bytes = one_tile ? qkv_front_impl::kStageCopyBytes<1> : qkv_front_impl::kStageCopyBytes<2>;
    for (int share = blockIdx.x; share < kShares; share += gridDim.x) {
      const qkv_front_impl::StreamKWork work = front_work(p, share);
      for (int64_t b = work.begin; b < work.end; ++b) {
        const int k_block = static_cast<int>(b % qkv_front_impl::kFrontBlocksPerTile);
        const int tile = static_cast<int>(b / qkv_front_impl::kFrontBlocksPerTile);
        ring.acquire(at);
        ring.arm(at, bytes);
        ptx::tma_load_2d(ring.stage_addr(at), maps.w, ring.full_bar(at), k_block * qkv_front_impl::kFrontBlockK,
                         tile * qkv_front_impl::kFrontTileRows, policy);
        ptx::tma_load_2d(ring.stage_addr(at) + qkv_front_impl::kWBytes, x_map, ring.full_bar(at),
                         k_block * qkv_front_impl::kFrontBlockK, g * kTokenGroup);
        at.advance();
      }
    }
  }
}

// Counts head `tile` of token group g as written (thread 0 of the consumers,
// after the epilogue's last barrier, which orders the 4 warps' stores before
// this release): q, k and v heads on the KV head's ready counter, gate heads
// on its gate counter.
inline __device__ void count_head(uint32_t* counters, const Params& p, int g, int tile) {
  const int kvh = p.num_kv_heads, q_heads = kHeadsPerKvHead * kvh;
  int word;
  if (tile < q_heads)
    word = Counters::kHeadReady + g * kvh + tile / kHeadsPerKvHead;
  else if (tile < q_heads + 2 * kvh)
    word = Counters::kHeadReady + g * kvh + (tile - q_heads) % kvh;
  else
    word = Counters::kGateReady + g * kvh + (tile - q_heads - 2 * kvh) / kHeadsPerKvHead;
  ptx::red_release_gpu_add(counters + word, 1u);
}

// The consumer warps: every share's segments of token group g with NT
// n-tiles, each head's sum merged over its shares and finished by the last.
template <int NT>
__device__ void consume_front_group(const FrontRing& ring, pipeline::Position<kFrontStages>& at,
                                    const qkv_front_impl::EpilogueSmem& epi, int* s_last, const Params& p, int g,
                                    void* qkv, uint8_t* front_ws, uint32_t* counters, int warp, int lane,
                                    trace::Recorder<Phase>& trace) {
  using namespace qkv_front_impl;
  const Params& bp = p;
  const qkv_front_impl::Params fp = front_params(bp, g, qkv, front_ws);
  // This group's cos|sin rows and slots: group 0's from the staging warp
  // (the first epilogue waits for them), a later group's from consumer warp
  // 0 once the previous group's epilogues have read theirs.
  bool inputs_staged = g > 0;
  if (g > 0) {
    sync_consumers();
    if (warp == 0) {
      if (g == 1) ptx::mbar_wait(epi.staged, 0);  // the staging warp is done with group 0's
      stage_epilogue_inputs(fp, epi, lane);
    }
    sync_consumers();
  }
  const FragRows rows = FragRows::of(warp, lane);
  const WorkspaceMerge<NT> merge(front_ws, qkv_tiles(bp));
  for (int share = blockIdx.x; share < kShares; share += gridDim.x) {
    const StreamKWork work = front_work(bp, share);
    int64_t b = work.begin;
    while (b < work.end) {
      const Segment seg = Segment::at(b, work.end);
      Chains<NT, kStreamKChains> chains;
      zero_chains(chains);
      mma_blocks<Release::kAfterMma>(chains, ring, at, b, seg.end, rows, lane);
      if (b == work.end) trace.mark(Phase::kFrontLoopDone);
      float acc[NT][4];
      sum_chains(chains, acc);
      if (!seg.whole && !merge.sum_if_last(acc, work, seg, s_last, threadIdx.x)) continue;
      head_epilogue<NT>(acc, epi, inputs_staged, seg.tile, fp, warp, lane);
      if (threadIdx.x == 0) count_head(counters, bp, g, seg.tile);
    }
  }
}

}  // namespace muse_decode::attention_block_impl
