// The ring of stages between a CTA's producer thread and its consumer warps,
// and the producer itself.
//
// Stage s of the ring holds one weight block (8 KB) and the matching 64
// columns of x; full[s] completes when both copies have landed (the TMA
// counts their bytes), empty[s] when all 4 consumer warps have released it.
// The weight does not depend on the previous kernel, so the producer issues
// the ring's first weight boxes before griddepcontrol.wait (programmatic
// dependent launch); x, the previous kernel's output, comes after it.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::qkv_front_impl {

// The consumer warps' barrier (the producer and staging warps never join).
__device__ __forceinline__ void sync_consumers() {
  ptx::named_barrier_sync<FrontBarrier::kConsumers, kConsumerThreads>();
}

// A position in a ring of S stages: the stage, and the parity of the phase
// its barriers complete next (it flips at every wrap).
template <int S>
struct RingPosition {
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// A CTA's ring: S stages of kStageBytes from `base` (1024-byte aligned: the
// 128-byte swizzle's period), and their barriers.
template <int S, int kStageBytes>
struct Ring {
  static constexpr int kStages = S;
  uint8_t* base;
  uint64_t* full;   // [S] one arrival (the producer's) and the copies' bytes
  uint64_t* empty;  // [S] one arrival per consumer warp

  __device__ __forceinline__ uint32_t weight(int s) const { return ptx::smem_addr(base + s * kStageBytes); }
  __device__ __forceinline__ uint32_t x(int s) const { return ptx::smem_addr(base + s * kStageBytes + kWBytes); }

  // Thread 0, before the CTA's first barrier.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kConsumerWarps);
    }
  }
};

// Block i of a CTA's stream: its 64 columns of K (block k_block of 128) and
// its 64 weight rows (tile = head).
struct BlockCoord {
  int k_block;
  int tile;
};

// The producer (lane 0 of the producer warp): the CTA's n blocks through the
// ring, block i into stage i % S once the consumers have released block
// i - S; block_at(i) says where block i is. The first kEarly weight boxes go
// out before griddepcontrol.wait; after it, the other stages' weight first,
// so HBM stays busy from the moment the previous grid is done, then x.
// tx_bytes: a stage's weight box and x box (NT * 8 token rows).
template <int kEarly, int S, int kStageBytes, typename BlockAt>
__device__ __forceinline__ void produce(const Ring<S, kStageBytes>& ring, const CUtensorMap* w_map,
                                        const CUtensorMap* x_map, uint32_t tx_bytes, int n, BlockAt&& block_at) {
  ptx::prefetch_tensor_map(w_map);
  ptx::prefetch_tensor_map(x_map);
  const auto copy_weight = [&](int i, int s) {
    const BlockCoord c = block_at(i);
    ptx::mbar_arrive_expect_tx(&ring.full[s], tx_bytes);
    ptx::tma_load_2d(ring.weight(s), w_map, ptx::smem_addr(&ring.full[s]), c.k_block * kFrontBlockK,
                     c.tile * kFrontTileRows);
  };
  const auto copy_x = [&](int i, int s) {
    ptx::tma_load_2d(ring.x(s), x_map, ptx::smem_addr(&ring.full[s]), block_at(i).k_block * kFrontBlockK, 0);
  };
  const int filled = n < S ? n : S;  // stages with no consumer to wait for
  const int early = kEarly < filled ? kEarly : filled;
  for (int i = 0; i < early; ++i) copy_weight(i, i);
  ptx::griddep_wait();  // x is the previous kernel's output
  for (int i = early; i < filled; ++i) copy_weight(i, i);
  for (int i = 0; i < filled; ++i) copy_x(i, i);
  RingPosition<S> at;  // the stage to refill, and the phase of its empty barrier to wait for
  for (int i = S; i < n; ++i) {
    ptx::mbar_wait(&ring.empty[at.stage], at.phase);
    copy_weight(i, at.stage);
    copy_x(i, at.stage);
    at.advance();
  }
}

}  // namespace muse_decode::qkv_front_impl
