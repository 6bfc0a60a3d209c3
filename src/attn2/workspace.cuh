// The split path's workspace (params.h has its layout): per (request,
// KV head) pair, one ticket counter per CTA rank, then each slice's partial
// rows: (m, l) and the 64 columns of O.
//
// Every 32-bit word of a partial is stored inverted, so that 0 (what the
// caller's zeroing and every merge leave behind) reads as "not written yet"
// and a word, once nonzero, is the value itself: the merger polls the words
// and needs no fence or flag to order them. The one value whose inverse is 0,
// the NaN 0xFFFFFFFF, is stored as the NaN 0x7FFFFFFF.
#pragma once

#include "../common/ptx.cuh"
#include "params.h"
#include "config.cuh"

namespace muse_decode::attn2_impl {

__device__ __forceinline__ uint32_t ws_word(float v) {
  const uint32_t b = __float_as_uint(v);
  return ~(b == 0xFFFFFFFFu ? 0x7FFFFFFFu : b);
}
__device__ __forceinline__ float ws_value(uint32_t w) { return __uint_as_float(~w); }

// kCols consecutive floats (2 or 4) as self-marking words.
template <int kCols>
__device__ __forceinline__ void ws_store(float* at, const float (&v)[kCols]) {
  static_assert(kCols == 2 || kCols == 4, "rows of 32 or 16 threads");
  if constexpr (kCols == 4)
    ptx::st_relaxed_gpu_v4(at, ws_word(v[0]), ws_word(v[1]), ws_word(v[2]), ws_word(v[3]));
  else
    ptx::st_relaxed_gpu_v2(at, ws_word(v[0]), ws_word(v[1]));
}
template <int kCols>
__device__ __forceinline__ void ws_load(const float* at, uint32_t (&w)[kCols]) {
  if constexpr (kCols == 4) {
    const uint4 v = ptx::ld_relaxed_gpu_v4(at);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = ptx::ld_relaxed_gpu_v2(at);
    w[0] = v.x, w[1] = v.y;
  }
}
// Back to "not written".
template <int kCols>
__device__ __forceinline__ void ws_clear(float* at) {
  if constexpr (kCols == 4)
    ptx::st_relaxed_gpu_v4(at, 0u, 0u, 0u, 0u);
  else
    ptx::st_relaxed_gpu_v2(at, 0u, 0u);
}

// One (request, KV head) pair's part of the workspace.
struct SplitWorkspace {
  int* counter;    // [C ranks] tickets
  float2* ml;      // [splits][64 rows] (m, l)
  float* o;        // [splits][64 rows][64]

  __device__ __forceinline__ SplitWorkspace(const Params& p, int req, int kvh, int rank) {
    const int64_t pairs = static_cast<int64_t>(p.num_reqs) * p.num_kv_heads;
    float2* all_ml = reinterpret_cast<float2*>(static_cast<char*>(p.workspace) + counter_bytes(pairs));
    float* all_o = reinterpret_cast<float*>(all_ml + pairs * p.num_splits * kRows);
    const int pair = req * p.num_kv_heads + kvh;
    counter = static_cast<int*>(p.workspace) + pair * kMaxCluster + rank;
    const int64_t slice0 = static_cast<int64_t>(pair) * p.num_splits * kRows;  // (pair, slice 0, row 0)
    ml = all_ml + slice0;
    o = all_o + slice0 * kHeadDim;
  }
  __device__ __forceinline__ int64_t at(int split, int row) const { return static_cast<int64_t>(split) * kRows + row; }
};

}  // namespace muse_decode::attn2_impl
