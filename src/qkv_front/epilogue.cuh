// The epilogue of one head (tile) whose sums are in the consumers'
// fragments: the weightless RMS norm and interleaved RoPE of q and k heads,
// the bf16 row of out, and k / v into the paged KV cache (bit-identical to
// out's). The 64 rows of a tile are exactly one head, so the norm and RoPE
// are local to it.
//
// Its per-token inputs (cos | sin of each position, clamped into the table,
// and the slots) are staged in shared memory once per CTA by a warp of its
// own, so that the kernel's tail reads no global memory for them. A warp of
// its own: loaded by the producer warp's idle lanes they delayed the
// producer's copies by ~0.6 us per token (H200, TP8 T = 16: 25.4 us
// against 13.6).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"
#include "pipeline.cuh"

namespace muse_decode::qkv_front_impl {

// Where the epilogue works in shared memory.
struct EpilogueSmem {
  float* ybuf;       // [T][kYStride]: the head's sums, token-major
  float* rope;       // [T][64]: cos | sin of each token's position
  int64_t* slot;     // [T]: each token's cache slot
  uint64_t* staged;  // completes once rope and slot are in place
};

// The staging warp: every token's epilogue inputs into shared memory.
__device__ __forceinline__ void stage_epilogue_inputs(const Params& p, const EpilogueSmem& sm, int lane) {
  ptx::griddep_wait();  // positions and slots may be the previous kernel's output
  const int T = p.num_tokens;
  int64_t pos = 0;
  if (lane < T) {
    pos = p.positions[lane];
    pos = pos < 0 ? 0 : pos >= p.max_pos ? p.max_pos - 1 : pos;
    sm.slot[lane] = p.slot_mapping[lane];
  }
  if (p.cos_sin != nullptr) {
    float c[kFrontMaxTokens], sn[kFrontMaxTokens];
#pragma unroll
    for (int t = 0; t < kFrontMaxTokens; ++t) {  // all loads in flight before the first store
      const int64_t row = __shfl_sync(0xFFFFFFFFu, pos, t);
      c[t] = t < T ? p.cos_sin[row * kHeadDim + lane] : 0.0f;
      sn[t] = t < T ? p.cos_sin[row * kHeadDim + kHeadDim / 2 + lane] : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < kFrontMaxTokens; ++t) {
      if (t < T) {
        sm.rope[t * kHeadDim + lane] = c[t];
        sm.rope[t * kHeadDim + kHeadDim / 2 + lane] = sn[t];
      }
    }
  }
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(sm.staged);
}

// The consumer warps: fragments -> ybuf[token][row], then per token (one
// warp each) the norm and RoPE of q and k heads, out, and k / v into the
// cache. inputs_staged: whether this CTA has waited for the staging warp.
// Ends with a consumer barrier, so ybuf may be rewritten afterwards.
template <int NT>
__device__ __forceinline__ void head_epilogue(const float (&acc)[NT][4], const EpilogueSmem& sm, bool& inputs_staged,
                                              int tile, const Params& p, int warp, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = warp * 16 + g, tok = nt * 8 + tq * 2;
    sm.ybuf[tok * kYStride + row] = acc[nt][0];
    sm.ybuf[(tok + 1) * kYStride + row] = acc[nt][1];
    sm.ybuf[tok * kYStride + row + 8] = acc[nt][2];
    sm.ybuf[(tok + 1) * kYStride + row + 8] = acc[nt][3];
  }
  sync_consumers();
  if (!inputs_staged) {
    ptx::mbar_wait(sm.staged, 0);
    inputs_staged = true;
  }
  const int kvh = p.num_kv_heads;
  const int q_heads = kHeadsPerKvHead * kvh;
  // 0: q, 1: k, 2: v, 3: gate
  const int kind = tile < q_heads ? 0 : tile < q_heads + kvh ? 1 : tile < q_heads + 2 * kvh ? 2 : 3;
  const int kv_head = kind == 1 ? tile - q_heads : tile - q_heads - kvh;
  for (int t = warp; t < p.num_tokens; t += kConsumerWarps) {
    const float2 y = *reinterpret_cast<const float2*>(&sm.ybuf[t * kYStride + 2 * lane]);
    float y0 = y.x, y1 = y.y;
    if (kind <= 1) {
      // Weightless RMS norm over the head's 64 values (fixed butterfly order).
      float ss = y0 * y0 + y1 * y1;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, m);
      const float r = rsqrtf(ss * (1.0f / kHeadDim) + kRmsNormEps);
      y0 *= r;
      y1 *= r;
      if (p.cos_sin != nullptr) {
        const float c = sm.rope[t * kHeadDim + lane], sn = sm.rope[t * kHeadDim + kHeadDim / 2 + lane];
        const float r0 = y0 * c - y1 * sn, r1 = y0 * sn + y1 * c;
        y0 = r0;
        y1 = r1;
      }
    }
    const __nv_bfloat162 v = __floats2bfloat162_rn(y0, y1);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + t * p.out_stride + tile * kFrontTileRows;
    reinterpret_cast<__nv_bfloat162*>(out)[lane] = v;
    if (kind == 1 || kind == 2) {
      const int64_t slot = sm.slot[t];
      if (slot >= 0 && slot < p.num_slots) {
        const int64_t row = ((slot / kPageSize) * kvh + kv_head) * kPageSize + slot % kPageSize;
        __nv_bfloat16* dst =
            static_cast<__nv_bfloat16*>(p.kv_cache) + row * kCacheRowWidth + (kind == 2 ? kHeadDim : 0);
        reinterpret_cast<__nv_bfloat162*>(dst)[lane] = v;
      }
    }
  }
  sync_consumers();  // ybuf is rewritten by the next head
}

}  // namespace muse_decode::qkv_front_impl
