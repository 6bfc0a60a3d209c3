// The o_proj kernel of one Config, composed of its parts, and its launch:
// the tensor maps of W and x and the launch shape. o_proj.cu instantiates the
// dispatch table's configurations.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/swizzle.cuh"
#include "../common/tensor_map.h"
#include "../common/trace.cuh"
#include "config.cuh"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "pipeline.cuh"

namespace muse_decode::o_proj_impl {

// The kernel's phase stamps (a traced build only). o_proj.cu, this header's
// one includer, so holds the ring once.
MUSE_DECODE_TRACE_RING(o_proj_trace)
static_assert(static_cast<int>(Phase::kExit) < trace::kStampWords, "every phase has a stamp word");

// CTA c computes out[:, c * kRows .. (c + 1) * kRows) over all of K.
template <typename Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm)
    o_proj_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                  const Params p) {
  trace::Recorder<Phase> trace(o_proj_trace());
  trace.tag(gridDim.x);
  // 1024-byte alignment of the dynamic shared memory (the 128-byte swizzle's
  // period), checked at entry.
  extern __shared__ __align__(swizzle::kAtomBytes) uint8_t smem[];
  const Rings<Cfg> rings = Rings<Cfg>::carve(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * Cfg::kRows;
  const int blocks = p.in_width / kBlockK;

  if (threadIdx.x == 0) {
    if (ptx::smem_addr(smem) % swizzle::kAtomBytes != 0) __trap();  // the swizzle addressing needs it
    rings.init();
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // A cluster's CTAs copy into each other's x stages: every CTA's barriers
  // are initialised before any CTA's first copy of x.
  if constexpr (Cfg::kXCluster > 1) {
    ptx::cluster_arrive_relaxed();
    ptx::cluster_wait();
  }
  // The next kernel may start as soon as every CTA is here: its own
  // griddepcontrol.wait still waits for all of this grid.
  ptx::griddep_launch_dependents();
  trace.mark(Phase::kInitSynced);

  if (warp == kProducerWarp) {
    if (lane == 0) produce_w<Cfg>(rings, &w_map, row0, blocks);
    return;
  }
  if (warp == kXProducerWarp) {
    if (lane == 0) produce_x<Cfg>(rings, &x_map, blocks);
    return;
  }
  WarpSums<Cfg> acc;
  if constexpr (Cfg::kWgmma)
    wgmma_blocks<Cfg>(rings, blocks, lane, acc, trace);
  else
    mma_blocks<Cfg>(rings, blocks, Lane::of<Cfg>(warp, lane), lane, acc, trace);
  store_tile<Cfg>(acc, smem, row0, p, warp, lane);
  trace.mark(Phase::kExit);
}

// The maps of a launch, from this host thread's table (src/common/tensor_map.h):
// a layer's weight always hits it, x when the allocator hands back its buffer.
struct MapSite {};

template <typename Cfg>
cudaError_t set_smem_limit() {
  return detail::set_smem_limit<o_proj_kernel<Cfg>>(Cfg::kSmemBytes);
}

template <typename Cfg>
cudaError_t launch_config(const Params& p, cudaStream_t stream) {
  CUtensorMap w_map, x_map;
  if (!tma::cached<MapSite, 8>(&w_map, tma::bf16_rows(p.weight, kOProjOutWidth, p.in_width, p.in_width, Cfg::kRows)) ||
      !tma::cached<MapSite, 8>(&x_map, tma::bf16_rows(p.x, p.num_tokens, p.in_width, p.x_stride, Cfg::kTokens)))
    return cudaErrorInvalidValue;
  const detail::LaunchShape shape{dim3(Cfg::kCtas), dim3(kThreads), static_cast<unsigned>(Cfg::kSmemBytes),
                                  Cfg::kXCluster > 1 ? Cfg::kXCluster : 0, p.pdl};
  return static_cast<cudaError_t>(detail::launch_kernel<o_proj_kernel<Cfg>>(shape, stream, w_map, x_map, p));
}

}  // namespace muse_decode::o_proj_impl
