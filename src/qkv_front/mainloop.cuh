// The consumers' mainloop: each of the 4 consumer warps multiplies its 16
// weight rows of every block in the ring (A, ldmatrix from the swizzled W
// tile) by x^T (B, NT n-tiles of 8 tokens) with mma.sync m16n8k16, bf16 in,
// fp32 accumulators. The tensor work is on the kernel's critical path (H200,
// TP8: with no MMA at all T = 16 ran 9.97 us against 10.75), so a block's
// loads all go out before its MMAs and the MMAs alternate over independent
// accumulator chains (config.cuh).
#pragma once

#include <cstdint>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/swizzle.cuh"
#include "config.cuh"
#include "pipeline.cuh"

namespace muse_decode::qkv_front_impl {

// The rows and chunks this lane addresses for ldmatrix (swizzle.cuh): A =
// the warp's 16 weight rows of the tile, B = x rows (tokens).
struct FragRows {
  int a_row, a_chunk, b_row, b_chunk;

  __device__ __forceinline__ static FragRows of(int warp, int lane) {
    return {warp * 16 + swizzle::a_row(lane), swizzle::a_chunk(lane), swizzle::b_row(lane), swizzle::b_chunk(lane)};
  }
};

// A block's operands in registers: the warp's A fragments and the B fragments
// of its NT n-tiles (n-tile nt in b[ks][2 nt], b[ks][2 nt + 1]) for the 4
// k-steps.
template <int NT>
struct BlockFrags {
  uint32_t a[kKSteps][4];
  uint32_t b[kKSteps][2 * NT];
};

template <int NT>
__device__ __forceinline__ void load_block(BlockFrags<NT>& f, uint32_t w_s, uint32_t x_s, const FragRows& r) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    ptx::ldmatrix_x4(f.a[ks], w_s + swizzle::offset(r.a_row, ks * 2 + r.a_chunk));
    if constexpr (NT == 2)
      ptx::ldmatrix_x4(f.b[ks], x_s + swizzle::offset(r.b_row, ks * 2 + r.b_chunk));
    else
      ptx::ldmatrix_x2(f.b[ks], x_s + swizzle::offset(r.b_row & 7, ks * 2 + r.b_chunk));
  }
}

// The accumulators: kChains independent chains of NT n-tiles; k-step ks
// accumulates into chain ks % kChains.
template <int NT, int kChains>
using Chains = float[kChains][NT][4];

template <int NT, int kChains>
__device__ __forceinline__ void mma_frags(Chains<NT, kChains>& chains, const BlockFrags<NT>& f) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      ptx::mma_m16n8k16_bf16(chains[ks % kChains][nt], f.a[ks], f.b[ks][2 * nt], f.b[ks][2 * nt + 1]);
}

template <int NT, int kChains>
__device__ __forceinline__ void zero_chains(Chains<NT, kChains>& chains) {
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) chains[c][nt][0] = chains[c][nt][1] = chains[c][nt][2] = chains[c][nt][3] = 0.0f;
}

// acc = chain 0 + chain 1 + ... (this order, so the bits are fixed).
template <int NT, int kChains>
__device__ __forceinline__ void sum_chains(const Chains<NT, kChains>& chains, float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = chains[0][nt][e];
#pragma unroll
      for (int c = 1; c < kChains; ++c) v += chains[c][nt][e];
      acc[nt][e] = v;
    }
}

// When a consumer warp gives a stage back to the producer.
enum class Release {
  kAfterMma,     // once its MMAs are issued
  kInRegisters,  // once its fragments are in registers, the MMAs then run while the producer refills it
                 // (cluster kernel, H200 TP8 T = 16: 10.74 us against 10.92)
};

// The consumer warps' loop over the CTA's blocks from `next` (advanced to
// `end`), from ring position `at` on: wait for the stage, multiply, release it.
template <Release kRelease, int NT, int kChains, typename Index, int S, int kStageBytes>
__device__ __forceinline__ void mma_blocks(Chains<NT, kChains>& chains, const Ring<S, kStageBytes>& ring,
                                           pipeline::Position<S>& at, Index& next, Index end, const FragRows& rows,
                                           int lane) {
  for (; next < end; ++next) {
    ring.wait(at);
    BlockFrags<NT> f;
    load_block(f, weight_of(ring, at), x_of(ring, at), rows);
    if constexpr (kRelease == Release::kAfterMma) mma_frags(chains, f);
    __syncwarp();
    if (lane == 0) ring.release(at);
    if constexpr (kRelease == Release::kInRegisters) mma_frags(chains, f);
    at.advance();
  }
}

}  // namespace muse_decode::qkv_front_impl
