// The ring between a CTA's producer thread and its consumer warps
// (src/common/pipeline.cuh), and the producer itself.
//
// Stage s of the ring holds one weight block (8 KB) and the matching 64
// columns of x; its full barrier completes when both copies have landed (the
// TMA counts their bytes), its empty barrier when all 4 consumer warps have
// released it. The weight does not depend on the previous kernel, so the
// producer issues the ring's first weight boxes before griddepcontrol.wait
// (programmatic dependent launch); x, the previous kernel's output, comes
// after it.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::qkv_front_impl {

// The consumer warps' barrier (the producer and staging warps never join).
__device__ __forceinline__ void sync_consumers() {
  ptx::named_barrier_sync<FrontBarrier::kConsumers, kConsumerThreads>();
}

// A CTA's ring: S stages of kStageBytes (the weight block, then x's box),
// from a 1024-byte aligned base (the swizzle's atom).
template <int S, int kStageBytes>
using Ring = pipeline::Ring<S, kStageBytes>;

template <int S, int kStageBytes>
__device__ __forceinline__ uint32_t weight_of(const Ring<S, kStageBytes>& ring, pipeline::Position<S> at) {
  return ring.stage_addr(at);
}
template <int S, int kStageBytes>
__device__ __forceinline__ uint32_t x_of(const Ring<S, kStageBytes>& ring, pipeline::Position<S> at) {
  return ring.stage_addr(at) + kWBytes;
}

// Block i of a CTA's stream: its 64 columns of K (block k_block of 128) and
// its 64 weight rows (tile = head).
struct BlockCoord {
  int k_block;
  int tile;
};

// The producer (lane 0 of the producer warp): the CTA's n blocks through the
// ring, block i into fill i once the consumers have released fill i - S;
// block_at(i) says where block i is. The first kEarly weight boxes go out
// before griddepcontrol.wait; after it, the other stages' weight first, so
// HBM stays busy from the moment the previous grid is done, then x.
// tx_bytes: a stage's weight box and x box (NT * 8 token rows).
template <int kEarly, int S, int kStageBytes, typename BlockAt>
__device__ __forceinline__ void produce(const Ring<S, kStageBytes>& ring, const CUtensorMap* w_map,
                                        const CUtensorMap* x_map, uint32_t tx_bytes, int n, BlockAt&& block_at) {
  using Position = pipeline::Position<S>;
  ptx::prefetch_tensor_map(w_map);
  ptx::prefetch_tensor_map(x_map);
  const auto copy_weight = [&](int i, Position at) {
    const BlockCoord c = block_at(i);
    ring.arm(at, tx_bytes);
    ptx::tma_load_2d(weight_of(ring, at), w_map, ring.full_bar(at), c.k_block * kFrontBlockK, c.tile * kFrontTileRows);
  };
  const auto copy_x = [&](int i, Position at) {
    ptx::tma_load_2d(x_of(ring, at), x_map, ring.full_bar(at), block_at(i).k_block * kFrontBlockK, 0);
  };
  const int filled = n < S ? n : S;  // the ring's first round: no consumer to wait for
  const int early = kEarly < filled ? kEarly : filled;
  for (int i = 0; i < early; ++i) copy_weight(i, Position::first(i));
  ptx::griddep_wait();  // x is the previous kernel's output
  for (int i = early; i < filled; ++i) copy_weight(i, Position::first(i));
  for (int i = 0; i < filled; ++i) copy_x(i, Position::first(i));
  Position at = Position::of(S);
  for (int i = S; i < n; ++i) {
    ring.acquire(at);
    copy_weight(i, at);
    copy_x(i, at);
    at.advance();
  }
}

}  // namespace muse_decode::qkv_front_impl
