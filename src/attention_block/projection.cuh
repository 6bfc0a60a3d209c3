// The block's o_proj: share s < 128 takes output columns [64 s, 64 s + 64)
// over all of K. Its weight is a ring of kWStages 8 KB blocks (64 columns x
// 64 of K, 128-byte swizzled) whose first fills copy as soon as the CTA's
// front is done: all of K at TP8, so x is the only read left after the
// attention. x (o_proj's input, the merge's rows) copies per token group once
// the group's rows are counted. qkv_front's consumer parts multiply: a weight
// block as A (16 rows per warp), x^T as B; blocks in K order into one chain,
// so the sum's order is fixed.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/trace.cuh"
#include "../qkv_front/mainloop.cuh"
#include "attention.cuh"
#include "config.cuh"
#include "front.cuh"
#include "muse_decode/o_proj.h"
#include "params.h"

namespace muse_decode::attention_block_impl {

using WRing = pipeline::Ring<kWStages, kWBlockBytes>;
// Independent accumulators the 4 k-steps of a block alternate over (summed
// in a fixed order after the loop): the weight is in shared memory, so the
// loop is the MMAs' dependent chain alone.
inline constexpr int kOutChains = 4;
using XRing = pipeline::Ring<1, 0>;  // one x per token group in flight: its full and empty barriers

inline __device__ int w_blocks(const Params& p) { return o_proj_in_width(p.num_kv_heads) / 64; }
// Fills of the weight ring for this CTA: every (share < kOutTiles, group, block).
inline __device__ int w_fills(const Params& p) {
  int shares = 0;
  for (int share = blockIdx.x; share < kOutTiles; share += gridDim.x) ++shares;
  return shares * num_groups(p) * w_blocks(p);
}
// The tile and block of fill f.
struct WFill {
  int tile, block;
};
inline __device__ WFill w_fill(const Params& p, int f) {
  const int per_share = num_groups(p) * w_blocks(p);
  return {static_cast<int>(blockIdx.x) + (f / per_share) * static_cast<int>(gridDim.x), (f % per_share) % w_blocks(p)};
}

// (The copying lane) fills [from, to) of the weight ring.
inline __device__ void produce_weight(const WRing& ring, const CUtensorMap* map, const Params& p, int from, int to) {
  for (int f = from; f < to; ++f) {
    const pipeline::Position<kWStages> at = pipeline::Position<kWStages>::of(f);
    if (f >= kWStages) ring.acquire(at);
    const WFill w = w_fill(p, f);
    ring.arm(at, kWBlockBytes);
    ptx::tma_load_2d(ring.stage_addr(at), map, ring.full_bar(at), w.block * 64, w.tile * kOutTileCols);
  }
}

// (The copying lane) x of token group g into the x area, once its rows are
// written: fill `fill` of the x ring.
inline __device__ void produce_x(const XRing& xr, uint32_t x_addr, const CUtensorMap* map, const Params& p,
                                 const uint32_t* counters, int g, int fill) {
  const uint32_t rows = static_cast<uint32_t>(
      (group_tokens(p, g) / kVerifyLen) * p.num_kv_heads * attn2_impl::kRows);
  ptx::wait_at_least(counters + Counters::kRowsDone + g, rows);
  ptx::fence_proxy_async_global();  // rows written by other CTAs, read by TMA
  const pipeline::Position<1> at = pipeline::Position<1>::of(fill);
  xr.acquire(at);
  const int boxes = w_blocks(p);
  xr.arm(at, boxes * kXBoxBytes);
  for (int b = 0; b < boxes; ++b) ptx::tma_load_2d(x_addr + b * kXBoxBytes, map, xr.full_bar(at), b * 64, g * kTokenGroup);
}

// The 4 multiplying warps: token group g of the CTA's `share`-th o_proj tile
// with NT n-tiles; w_at and x_fill run on over the CTA's fills.
template <int NT>
__device__ void project_group(const WRing& ring, pipeline::Position<kWStages>& w_at, const XRing& xr, int x_fill,
                              uint32_t x_addr, const Params& p, int tile, int g, int warp, int lane,
                              trace::Recorder<Phase>& trace) {
  using namespace qkv_front_impl;
  const pipeline::Position<1> xat = pipeline::Position<1>::of(x_fill);
  xr.wait(xat);
  if (x_fill == 0) trace.mark(Phase::kXLanded);
  const FragRows rows = FragRows::of(warp, lane);
  Chains<NT, kOutChains> chains;
  zero_chains(chains);
  // Block b + 1's fragments load while block b's MMAs run (two fragment
  // sets, the loop unrolled by two so that both stay in registers).
  const int nb = w_blocks(p);
  BlockFrags<NT> f0, f1;
  ring.wait(w_at);
  load_block(f0, ring.stage_addr(w_at), x_addr, rows);
  const auto step = [&](int b, BlockFrags<NT>& cur, BlockFrags<NT>& nxt) {
    pipeline::Position<kWStages> next = w_at;
    next.advance();
    if (b + 1 < nb) {
      ring.wait(next);
      load_block(nxt, ring.stage_addr(next), x_addr + (b + 1) * kXBoxBytes, rows);
    }
    mma_frags(chains, cur);
    __syncwarp();
    if (lane == 0) ring.release(w_at);
    w_at = next;
  };
  for (int b = 0; b < nb; b += 2) {  // nb is even: 16 or 32 blocks
    step(b, f0, f1);
    step(b + 1, f1, f0);
  }
  __syncwarp();
  if (lane == 0) xr.release(xat);
  float acc[NT][4];
  sum_chains(chains, acc);
  // The accumulator of mma m16n8: weight rows (output columns) lane / 4 and
  // + 8 of the warp's 16, tokens 2 (lane % 4) and + 1 of each n-tile.
  const int T = group_tokens(p, g), t0 = g * kTokenGroup;
  const int col = tile * kOutTileCols + warp * 16 + lane / 4;
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = nt * 8 + (lane % 4) * 2 + (e & 1);
      if (t < T) out[int64_t{t0 + t} * p.out_stride + col + (e >> 1) * 8] = __float2bfloat16_rn(acc[nt][e]);
    }
}

}  // namespace muse_decode::attention_block_impl
