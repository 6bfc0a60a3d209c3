// Steps 4-5 of the contract for one token, in warp 0: the 8 slots' scores
// summed left to right and each slot's weight, then the ids and weights
// stored (lane k: slot k).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.cuh"

namespace muse_decode::route_impl {

// A slot's expert and weight: lane k < 8 of warp 0 holds slot k's.
struct Slot {
  int id = 0;
  float weight = 0.0f;
};

// Every lane of warp 0 (after a CTA barrier behind rank_finalists): lane l
// takes slot l % 8, gathers the 8 scores (independent shuffles) and adds
// them left to right, so each lane's sum is step 4's.
__device__ __forceinline__ Slot weigh_slot(const Params& p, const int* slot_ids, const float* scores, int lane) {
  Slot slot;
  slot.id = slot_ids[lane % kTopK];
  const float score = scores[slot.id];
  float v[kTopK];
#pragma unroll
  for (int k = 0; k < kTopK; ++k) v[k] = __shfl_sync(kAll, score, k);
  float sum = v[0];
#pragma unroll
  for (int k = 1; k < kTopK; ++k) sum = __fadd_rn(sum, v[k]);
  slot.weight = __fdiv_rn(__fmul_rn(score, p.route_scale), __fadd_rn(sum, kRouteDivisionEps));
  return slot;
}

// Lane k < 8 of warp 0: token t's slot k. With metadata, a slot whose
// expert is another rank's (`elsewhere`) has no permuted row.
template <bool kMetadata>
__device__ __forceinline__ void store_slot(const Params& p, int t, int lane, const Slot& slot, bool elsewhere) {
  p.ids[t * kTopK + lane] = slot.id;
  p.weights[t * kTopK + lane] = slot.weight;
  if (kMetadata && elsewhere) p.metadata[kMetaExpandedToPermuted + t * kTopK + lane] = -1;
}

}  // namespace muse_decode::route_impl
