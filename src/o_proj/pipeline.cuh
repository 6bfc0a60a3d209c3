// The two rings between a CTA's producer threads and its consumer warps
// (src/common/pipeline.cuh), and the producers themselves.
//
// Block b of K (64 columns) is fill b of the weight ring (kWStages stages)
// and of the x ring (kXStages); each stage has a full barrier (the
// producer's arrival and the copy's bytes) and an empty barrier (one arrival
// per consumer warp). The weight does not depend on the previous kernel, so
// its copies never wait for it: every block that has a free stage leaves at
// once, including the blocks that refill the stages of the blocks the
// consumers hold in registers; x, the previous kernel's output, only after
// griddepcontrol.wait.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::o_proj_impl {

__device__ __forceinline__ void sync_consumers() {
  ptx::named_barrier_sync<OProjBarrier::kConsumers, kConsumerThreads>();
}

// A CTA's two rings, carved from its shared memory as Config lays it out.
template <typename Cfg>
struct Rings {
  using W = pipeline::Ring<Cfg::kWStages, Cfg::kWBytes>;
  using X = pipeline::Ring<Cfg::kXStages, Cfg::kXBytes>;
  W w;
  X x;

  __device__ __forceinline__ static Rings carve(uint8_t* smem) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
    return {{ptx::smem_addr(smem), bars, bars + Cfg::kWStages},
            {ptx::smem_addr(smem + Cfg::kXOffset), bars + 2 * Cfg::kWStages, bars + 2 * Cfg::kWStages + Cfg::kXStages}};
  }
  __device__ __forceinline__ void init() const {
    w.init(kConsumerWarps);
    x.init(kConsumerWarps);
  }
};

// Block b of `blocks` (columns 64 b .. of `map`, `row` its first row) as
// fill b of `ring`, in order, each block once the consumers have released
// fill b - S (the ring's first round waits for nothing).
template <int S, int kBytes>
__device__ __forceinline__ void stream_blocks(const pipeline::Ring<S, kBytes>& ring, const CUtensorMap* map, int row,
                                              int blocks) {
  pipeline::Position<S> at;
  for (int b = 0; b < blocks; ++b) {
    if (b >= S) ring.acquire(at);
    ring.arm(at, kBytes);
    ptx::tma_load_2d(ring.stage_addr(at), map, ring.full_bar(at), b * kBlockK, row);
    at.advance();
  }
}

// The two producers, each one thread, so that neither ring's copies wait
// behind the other's barriers.
//
// The weight's (lane 0 of kProducerWarp), for the CTA's `blocks` blocks of
// its kRows weight rows from `row0`, without waiting for the previous
// kernel: the blocks that have a stage at once, then, as the consumers take
// the first kHeldBlocks into registers, the blocks that go into the stages
// they free, then each later block as its stage is freed.
template <typename Cfg>
__device__ __forceinline__ void produce_w(const Rings<Cfg>& r, const CUtensorMap* w_map, int row0, int blocks) {
  ptx::prefetch_tensor_map(w_map);
  stream_blocks(r.w, w_map, row0, blocks);
}

// x's (lane 0 of kXProducerWarp): griddepcontrol.wait (x is the previous
// kernel's output), then x's blocks (all NT * 8 token rows from row 0) the
// same way.
// Over a cluster (kXCluster > 1) every CTA arms each block's stage for its
// bytes, and rank r copies the blocks b with b % kXCluster == r into the
// whole cluster; a peer's bytes may land before this CTA arms the stage
// (the barrier's byte count then runs below zero until the arming, and its
// phase cannot complete without that arrival).
template <typename Cfg>
__device__ __forceinline__ void produce_x(const Rings<Cfg>& r, const CUtensorMap* x_map, int blocks) {
  ptx::prefetch_tensor_map(x_map);
  ptx::griddep_wait();
  if constexpr (Cfg::kXCluster == 1) {
    stream_blocks(r.x, x_map, 0, blocks);
  } else {
    constexpr uint16_t kAll = (1u << Cfg::kXCluster) - 1;
    const int rank = static_cast<int>(ptx::cluster_ctarank());
    for (int b = 0; b < blocks; ++b) {
      const auto at = pipeline::Position<Cfg::kXStages>::first(b);
      r.x.arm(at, Cfg::kXBytes);
      if (b % Cfg::kXCluster == rank)
        ptx::tma_load_2d_multicast(r.x.stage_addr(at), x_map, r.x.full_bar(at), b * kBlockK, 0, kAll);
    }
  }
}

}  // namespace muse_decode::o_proj_impl
