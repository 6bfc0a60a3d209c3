// attn2's epilogue: out = bf16(sigmoid(gate) * o * rsqrt(mean(o^2) + eps)),
// the o-norm and sigmoid gate of the contract, for the columns of a merged
// row that this thread holds.
#pragma once

#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::attn2_impl {

// sigmoid of kCols gate columns (bf16, the first kCols of g). The gate is
// known before the merges, so where the key loops are short this runs while
// they are in flight.
template <int kCols>
__device__ __forceinline__ void gate_sigmoid(const uint2 g, float (&sg)[kCols]) {
  const float2 g01 = ptx::unpack_bf16(g.x);
  const float2 g23 = ptx::unpack_bf16(g.y);
  const float gv[4] = {g01.x, g01.y, g23.x, g23.y};
#pragma unroll
  for (int k = 0; k < kCols; ++k) sg[k] = 1.0f / (1.0f + __expf(-gv[k]));
}

// The o-norm and gate of kCols columns of a row whose 64 columns are spread
// over kRowThreads consecutive lanes, from O's unnormalised sums o and their
// softmax sum l: o / l * rsqrt(mean((o / l)^2) + eps) = o * rsqrt(mean(o^2) +
// eps l^2) for l > 0, so nothing waits on a division by l (2k, 8k and
// max_model_len 2048 0.03-0.04 us less than dividing first); a NaN l (a
// broken row) still makes the row NaN.
template <int kRowThreads, int kCols>
__device__ __forceinline__ void finish_row(const float (&o)[kCols], float l, const float (&sg)[kCols],
                                           __nv_bfloat16* out) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kCols; ++k) ss = fmaf(o[k], o[k], ss);
#pragma unroll
  for (int m = 1; m < kRowThreads; m <<= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, m);
  const float rms = rsqrtf(fmaf(ss, 1.0f / kHeadDim, kRmsNormEps * l * l));
  float y[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) y[k] = o[k] * rms * sg[k];
  if constexpr (kCols == 4) {
    uint2 v;
    v.x = ptx::pack_bf16(y[0], y[1]);
    v.y = ptx::pack_bf16(y[2], y[3]);
    *reinterpret_cast<uint2*>(out) = v;
  } else {
    static_assert(kCols == 2, "rows of 16 or 32 threads");
    *reinterpret_cast<uint32_t*>(out) = ptx::pack_bf16(y[0], y[1]);
  }
}

}  // namespace muse_decode::attn2_impl
