// Steps 1-3 of the contract (docs/contract.md) for one token: each expert's
// score and key, the 8 best of each warp's 32 experts, and the ranking of
// those 64 finalists into the 8 slots.
//
// Each token's top 8 is a dependent chain of instructions, so the chain is
// kept short: a warp ranks its 32 candidates with 32 shuffles of the 32-bit
// key (the expert is the lane), and 64 threads then rank the finalists by
// their whole 64-bit words against each other, 64 compares each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.cuh"

namespace muse_decode::route_impl {

// A candidate as one word that orders like the contract's step 3: the key as
// an order-preserving integer in the upper half (NaN above every number, -0
// equal to +0), 255 - expert in the lower half, so equal keys rank the lower
// expert first. Words are unique (one per expert): ranks are a permutation.
__device__ __forceinline__ uint64_t candidate(float key, int expert) {
  uint32_t ord;
  if (key != key) {
    ord = 0xFFFFFFFFu;
  } else {
    const uint32_t u = key == 0.0f ? 0u : __float_as_uint(key);
    ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return (static_cast<uint64_t>(ord) << 32) | static_cast<uint32_t>(kNumExperts - 1 - expert);
}
__device__ __forceinline__ int expert_of(uint64_t c) { return kNumExperts - 1 - static_cast<int>(c & 0xFFFFFFFFu); }

// Steps 1-2: torch.sigmoid's arithmetic (accurate expf, then 1 / y correctly
// rounded, which __frcp_rn is), kept in `scores` by expert, then one fp32 add
// of the bias. Returns expert e's candidate word.
__device__ __forceinline__ uint64_t score_expert(const Params& p, int t, int e, float bias, float* scores) {
  const float x = p.logits[t * p.logits_stride + e];
  const float s = __frcp_rn(__fadd_rn(1.0f, expf(-x)));
  scores[e] = s;
  return candidate(__fadd_rn(s, bias), e);
}

// The warp's 8 best candidates into finalists[warp * 8 + rank]. Lane m holds
// expert warp*32 + m, so only the 32-bit key travels: a tie goes to the lower
// lane.
__device__ __forceinline__ void keep_warp_top8(uint64_t mine, int warp, int lane, uint64_t* finalists) {
  const uint32_t key = static_cast<uint32_t>(mine >> 32);
  int rank = 0;
#pragma unroll
  for (int m = 0; m < 32; ++m) {
    const uint32_t other = __shfl_sync(kAll, key, m);
    rank += other > key || (other == key && m < lane);
  }
  if (rank < kTopK) finalists[warp * kTopK + rank] = mine;
}

// Step 3: thread f < 64 ranks finalist f among all 64; ranks 0..7 are the
// slots, whose experts go to slot_ids (keys descending, then experts
// ascending; NaN first). Every thread (f: threadIdx.x), after a CTA barrier
// behind keep_warp_top8.
__device__ __forceinline__ void rank_finalists(const uint64_t* finalists, int* slot_ids, unsigned f) {
  if (f < kFinalists) {
    const uint64_t c = finalists[f];
    int r = 0;
#pragma unroll 16
    for (int m = 0; m < kFinalists; ++m) r += finalists[m] > c;
    if (r < kTopK) slot_ids[r] = expert_of(c);
  }
}

}  // namespace muse_decode::route_impl
