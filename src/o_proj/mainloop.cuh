// The consumers' mainloop: warp w multiplies the kMTilesPerWarp m16 tiles of
// its row group (w % kRowGroups) of every weight block by x^T over the
// k-steps of its k-group (w / kRowGroups), mma.sync m16n8k16, bf16 in, fp32
// accumulators; the x fragments of a k-step serve all of the warp's m-tiles. A block's ldmatrix loads all
// go out before its MMAs; the warp gives the block's two stages back as soon
// as its fragments are in registers, so the producer refills them while the
// MMAs run; the MMAs alternate over kChains independent accumulators, summed
// in chain order after the loop (fixed, so the bits are too).
#pragma once

#include <cstdint>

#include "../common/ptx.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/swizzle.cuh"
#include "config.cuh"
#include "pipeline.cuh"

namespace muse_decode::o_proj_impl {

// What this lane addresses for ldmatrix (swizzle.cuh). A: the warp's 16
// weight rows of an m-tile; B: x rows (tokens) of an n-tile pair.
struct Lane {
  int a_row, a_chunk, b_row, b_chunk;  // a_row: in the warp's first m-tile
  int first_step;                      // the warp's k-group's first k-step of a block

  template <typename Cfg>
  __device__ __forceinline__ static Lane of(int warp, int lane) {
    const int row_group = warp % Cfg::kRowGroups, k_group = warp / Cfg::kRowGroups;
    return {row_group * Cfg::kMTilesPerWarp * 16 + swizzle::a_row(lane), swizzle::a_chunk(lane),
            swizzle::b_row(lane), swizzle::b_chunk(lane), k_group * Cfg::kStepsPerWarp};
  }
};

// One block's operands of one warp: A of its m-tiles for its k-steps, B for
// the NT n-tiles (n-tile nt in b[j][2 nt], b[j][2 nt + 1]).
template <typename Cfg>
using AFrags = uint32_t[Cfg::kStepsPerWarp][Cfg::kMTilesPerWarp][4];
template <typename Cfg>
using BFrags = uint32_t[Cfg::kStepsPerWarp][2 * Cfg::NT];

template <typename Cfg>
__device__ __forceinline__ void load_a(AFrags<Cfg>& a, uint32_t w_s, const Lane& l) {
#pragma unroll
  for (int j = 0; j < Cfg::kStepsPerWarp; ++j)
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt)
      ptx::ldmatrix_x4(a[j][mt], w_s + swizzle::offset(l.a_row + mt * 16, (l.first_step + j) * 2 + l.a_chunk));
}

template <typename Cfg>
__device__ __forceinline__ void load_b(BFrags<Cfg>& b, uint32_t x_s, const Lane& l) {
#pragma unroll
  for (int j = 0; j < Cfg::kStepsPerWarp; ++j) {
    const int ks = l.first_step + j;
    if constexpr (Cfg::NT == 1) {
      uint32_t (&b2)[2] = *reinterpret_cast<uint32_t(*)[2]>(&b[j][0]);
      ptx::ldmatrix_x2(b2, x_s + swizzle::offset(l.b_row & 7, ks * 2 + l.b_chunk));
    } else {
#pragma unroll
      for (int p = 0; p < Cfg::NT / 2; ++p) {
        uint32_t (&b4)[4] = *reinterpret_cast<uint32_t(*)[4]>(&b[j][4 * p]);
        ptx::ldmatrix_x4(b4, x_s + swizzle::offset(p * 16 + l.b_row, ks * 2 + l.b_chunk));
      }
    }
  }
}

// A warp's sums: its m-tiles' NT n-tiles, the accumulator fragments of mma m16n8.
template <typename Cfg>
using WarpSums = float[Cfg::kMTilesPerWarp][Cfg::NT][4];

// A warp's accumulators: kChains chains of its sums; k-step j of a block
// goes into chain j % kChains.
template <typename Cfg>
struct Accumulators {
  float c[Cfg::kChains][Cfg::kMTilesPerWarp][Cfg::NT][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int ch = 0; ch < Cfg::kChains; ++ch)
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[ch][mt][nt][e] = 0.0f;
  }

  __device__ __forceinline__ void mma(const AFrags<Cfg>& a, const BFrags<Cfg>& b) {
#pragma unroll
    for (int j = 0; j < Cfg::kStepsPerWarp; ++j)
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::NT; ++nt)
          ptx::mma_m16n8k16_bf16(c[j % Cfg::kChains][mt][nt], a[j][mt], b[j][2 * nt], b[j][2 * nt + 1]);
  }

  // acc = chain 0 + chain 1 + ... (this order).
  __device__ __forceinline__ void sum(WarpSums<Cfg>& acc) const {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt)
#pragma unroll
      for (int nt = 0; nt < Cfg::NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = c[0][mt][nt][e];
#pragma unroll
          for (int ch = 1; ch < Cfg::kChains; ++ch) v += c[ch][mt][nt][e];
          acc[mt][nt][e] = v;
        }
  }
};

// The consumer warps' loop over the CTA's `blocks` blocks. First, before x
// exists, the A fragments of the first kHeldBlocks blocks go into registers
// and their weight stages back to the producer, which refills them before
// its griddepcontrol.wait. Then block by block: wait for the block's x (and
// weight, unless held), load the fragments, release the stages, multiply.
// acc: this warp's sums of its m-tiles over its k-group's k-steps.
template <typename Cfg, typename Trace>
__device__ __forceinline__ void mma_blocks(const Rings<Cfg>& r, int blocks, const Lane& l, int lane,
                                           WarpSums<Cfg>& acc, Trace& trace) {
  constexpr int kHeld = Cfg::kHeldBlocks;
  AFrags<Cfg> held[kHeld > 0 ? kHeld : 1];
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    if (h < blocks) {  // stage h, its first fill
      const auto at = pipeline::Position<Cfg::kWStages>::of(h);
      r.w.wait(at);
      load_a<Cfg>(held[h], r.w.stage_addr(at), l);
      __syncwarp();
      if (lane == 0) r.w.release(at);
    }
  }
  trace.mark(Phase::kHeld);
  Accumulators<Cfg> chains;
  chains.zero();
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    if (h < blocks) {
      const auto xat = pipeline::Position<Cfg::kXStages>::of(h);
      r.x.wait(xat);
      if (h == 0) trace.mark(Phase::kFirstX);
      BFrags<Cfg> b;
      load_b<Cfg>(b, r.x.stage_addr(xat), l);
      __syncwarp();
      if (lane == 0) r.x.release(xat);
      chains.mma(held[h], b);
    }
  }
  for (int b = kHeld; b < blocks; ++b) {
    const auto wat = pipeline::Position<Cfg::kWStages>::of(b);
    const auto xat = pipeline::Position<Cfg::kXStages>::of(b);
    r.w.wait(wat);
    r.x.wait(xat);
    if (kHeld == 0 && b == 0) trace.mark(Phase::kFirstX);
    AFrags<Cfg> a;
    BFrags<Cfg> x;
    load_a<Cfg>(a, r.w.stage_addr(wat), l);
    load_b<Cfg>(x, r.x.stage_addr(xat), l);
    __syncwarp();
    if (lane == 0) {
      r.w.release(wat);
      r.x.release(xat);
    }
    chains.mma(a, x);
  }
  chains.sum(acc);
  trace.mark(Phase::kLoopDone);
}

// The wgmma form of the loop (a kWgmma configuration on sm_90a): per block,
// the warpgroup issues 4 wgmma m64nNk16 over the block's 4 k-steps, A the
// weight box (64 rows, K-major) and B the x box (N token rows, K-major),
// both read from the stages in their 128-byte swizzle, accumulating in
// registers; a block's stages go back once the group after it has been
// issued and its own has completed (one group in flight). acc[0]: warp w's
// sums of rows 16 w .. 16 w + 15, the mma.sync m16n8 layout.
template <typename Cfg, typename Trace>
__device__ __forceinline__ void wgmma_blocks(const Rings<Cfg>& r, int blocks, int lane, WarpSums<Cfg>& acc,
                                             Trace& trace) {
  static_assert(Cfg::kWgmma, "a wgmma configuration");
  float (&d)[Cfg::NT][4] = acc[0];
#pragma unroll
  for (int nt = 0; nt < Cfg::NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[nt][e] = 0.0f;
  using WPosition = pipeline::Position<Cfg::kWStages>;
  using XPosition = pipeline::Position<Cfg::kXStages>;
  const auto release = [&](int b) {
    if (lane == 0) {
      r.w.release(WPosition::of(b));
      r.x.release(XPosition::of(b));
    }
  };
  for (int b = 0; b < blocks; ++b) {
    const WPosition wat = WPosition::of(b);
    const XPosition xat = XPosition::of(b);
    r.w.wait(wat);
    r.x.wait(xat);
    if (b == 0) trace.mark(Phase::kFirstX);
    const uint32_t w_s = r.w.stage_addr(wat), x_s = r.x.stage_addr(xat);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      ptx::wgmma_ss(d, ptx::sw128_desc(w_s + ks * 32, 16, swizzle::kAtomBytes),
                    ptx::sw128_desc(x_s + ks * 32, 16, swizzle::kAtomBytes), 1);
    ptx::wgmma_commit();
    if (b > 0) {
      ptx::wgmma_wait<1>();  // block b - 1's group is done reading its stages
      release(b - 1);
    }
  }
  ptx::wgmma_wait<0>();
  ptx::pin(d);  // the sums are read only after the last group completes
  if (blocks > 0) release(blocks - 1);
  trace.mark(Phase::kLoopDone);
}

}  // namespace muse_decode::o_proj_impl
