// The o_proj kernel of one Config, composed of its parts, and its launch:
// the tensor maps of W and x and the launch shape. o_proj.cu instantiates the
// dispatch table's configurations.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tensor_map_cache.h"
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
  extern __shared__ __align__(1024) uint8_t smem[];
  const Rings<Cfg> rings = Rings<Cfg>::carve(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * Cfg::kRows;
  const int blocks = p.in_width / kBlockK;

  if (threadIdx.x == 0) {
    if (ptx::smem_addr(smem) & 1023u) __trap();  // the swizzle addressing needs it
    rings.w.init();
    rings.x.init();
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
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

// L2 promotion of the TMA reads: none (qkv_front's measurement on the same
// weight stream: 256-byte promotion cost TP1 5%).
constexpr CUtensorMapL2promotion kL2Promotion = CU_TENSOR_MAP_L2_PROMOTION_NONE;

// A bf16 [rows, width] tensor (row stride in elements) read in boxes of
// box_rows x 64 columns, 128-byte swizzle; rows past `rows` read as zeros.
inline bool encode_map(CUtensorMap* map, const void* data, int64_t rows, int64_t width, int64_t row_stride,
                       int box_rows) {
  const auto encode = detail::encode_tiled_fn();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {kBlockK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, kL2Promotion,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A launch's map from this host thread's table (tensor_map_cache.h): a
// layer's weight always hits it, x when the allocator hands back its buffer.
inline bool make_map(CUtensorMap* map, const void* data, int64_t rows, int64_t width, int64_t row_stride,
                     int box_rows) {
  return detail::cached_tensor_map<8>(
      map, detail::TensorMapKey{data, {rows, width, row_stride, box_rows}},
      [&](CUtensorMap* m) { return encode_map(m, data, rows, width, row_stride, box_rows); });
}

template <typename Cfg>
cudaError_t set_smem_limit() {
  return cudaFuncSetAttribute(o_proj_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
}

template <typename Cfg>
cudaError_t launch_config(const Params& p, cudaStream_t stream) {
  CUtensorMap w_map, x_map;
  if (!make_map(&w_map, p.weight, kOProjOutWidth, p.in_width, p.in_width, Cfg::kRows) ||
      !make_map(&x_map, p.x, p.num_tokens, p.in_width, p.x_stride, Cfg::kTokens))
    return cudaErrorInvalidValue;
  const detail::LaunchShape shape{dim3(Cfg::kCtas), dim3(kThreads), static_cast<unsigned>(Cfg::kSmemBytes), 0,
                                  p.pdl};
  return static_cast<cudaError_t>(detail::launch_kernel<o_proj_kernel<Cfg>>(shape, stream, w_map, x_map, p));
}

}  // namespace muse_decode::o_proj_impl
