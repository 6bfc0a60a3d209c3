// The online-softmax state of a thread's two rows and its steps: masks,
// exp2 of the scores, running max and sum, O's rescale.
//
// Fragments are those of an m16n8 accumulator (mma.sync and, per warp,
// wgmma's m64nN): n-tile t of this thread in s[t], rows r = 0 (elements 0, 1)
// and r = 1 (elements 2, 3); the 4 lanes of a row hold disjoint columns.
// Scores stay raw (not scaled) until exp2: p = exp2(s * c - m * c) with c =
// scale * log2(e), one FFMA per score.
#pragma once

#include <cmath>

#include "../common/online_softmax.cuh"
#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::attn2_impl {

// Per-thread state of rows lane / 4 and lane / 4 + 8 of the warp's 16: the
// unnormalised O (relative to m), the running max m (raw score units) and sum l:
// two rows' softmax::State in the accumulator layout of the key loop's MMAs.
struct SoftmaxState {
  float o[8][4];
  float m[2];
  float l[2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  }
  // Another state of the same rows (m1, l1 per row; O in o1's fragment
  // layout) into this one: the union of their keys.
  template <typename OAt>
  __device__ __forceinline__ void merge(const float (&m1)[2], const float (&l1)[2], OAt&& o1) {
    float a0[2], a1[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const softmax::MergeWeights w = softmax::merge_weights(m[r], m1[r], kScaleLog2);
      a0[r] = w.a;
      a1[r] = w.b;
      m[r] = w.m;
      l[r] = a0[r] * l[r] + a1[r] * l1[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float4 v = o1(n);
      o[n][0] = a0[0] * o[n][0] + a1[0] * v.x;
      o[n][1] = a0[0] * o[n][1] + a1[0] * v.y;
      o[n][2] = a0[1] * o[n][2] + a1[1] * v.z;
      o[n][3] = a0[1] * o[n][3] + a1[1] * v.w;
    }
  }
  // The row sums over the row's 4 lanes, which hold disjoint columns (fixed
  // butterfly order).
  __device__ __forceinline__ void reduce_row_sums() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
      l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
    }
  }
};

// Scores of keys a row does not see (past its position, below its window)
// become -inf; key(t, e) is the key of this thread's element e of n-tile t.
// A select, so NaN scores of keys past L vanish too.
template <int N, typename KeyOf>
__device__ __forceinline__ void mask_tile(float (&s)[N][4], KeyOf key, int pos, int window) {
#pragma unroll
  for (int t = 0; t < N; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key(t, e);
      const bool visible = j <= pos && (window == 0 || j > pos - window);
      s[t][e] = visible ? s[t][e] : -INFINITY;
    }
}

// O of this thread's rows times the rows' alpha.
__device__ __forceinline__ void rescale(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// P of one S tile in place, p = exp2(s * c + neg_mc[r]), each row's p added
// to sum[r] in n-tile order.
template <int N>
__device__ __forceinline__ void exp2_tile(float (&s)[N][4], const float (&neg_mc)[2], float (&sum)[2]) {
#pragma unroll
  for (int t = 0; t < N; ++t) {
    s[t][0] = ptx::exp2_approx(fmaf(s[t][0], kScaleLog2, neg_mc[0]));
    s[t][1] = ptx::exp2_approx(fmaf(s[t][1], kScaleLog2, neg_mc[0]));
    s[t][2] = ptx::exp2_approx(fmaf(s[t][2], kScaleLog2, neg_mc[1]));
    s[t][3] = ptx::exp2_approx(fmaf(s[t][3], kScaleLog2, neg_mc[1]));
    sum[0] += s[t][0] + s[t][1];
    sum[1] += s[t][2] + s[t][3];
  }
}

// One tile's online softmax in place: the tile's row max joins m, l takes
// its rescale and the tile's sums, and alpha returns the factor O must take.
// A row with nothing visible yet stays at m = -inf, l = 0.
template <int N>
__device__ __forceinline__ void online_softmax(float (&s)[N][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int t = 0; t < N; ++t) {
    mx[0] = fmaxf(mx[0], fmaxf(s[t][0], s[t][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[t][2], s[t][3]));
  }
  float neg_mc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r]);
    const float ref = softmax::reference(m_new);
    alpha[r] = softmax::weight(m_run[r], ref, kScaleLog2);
    neg_mc[r] = -ref * kScaleLog2;
    m_run[r] = m_new;
    l_run[r] *= alpha[r];
  }
  exp2_tile(s, neg_mc, l_run);
}

// A warpgroup's tiles after its first: the softmax against the row max it
// already holds, without a max of its own (no FMNMX chain, no shuffles, no
// rescale of O; TP8 128k -0.45 us, 32k -0.18, TP1 x 8 128k -6%). P = exp2(s c
// - m c) and its sums are exact in any scale fp32 holds, so only a score far
// above m needs the usual step: where a row's running sum would pass kFarSum
// (some p near 2^32 or inf; O stays far from fp32's limit below it), or a row
// has no m yet (nothing visible in its first tile), this returns true with s
// overwritten (it holds no scores) and l untouched, and the caller computes the
// tile's scores again and takes online_softmax. Otherwise s holds P and l
// its sums. Warp-uniform.
inline constexpr float kFarSum = 0x1p32f;

template <int N>
__device__ __forceinline__ bool later_softmax(float (&s)[N][4], const float (&m_run)[2], float (&l_run)[2]) {
  const bool no_m = m_run[0] == -INFINITY || m_run[1] == -INFINITY;
  const float neg_mc[2] = {-m_run[0] * kScaleLog2, -m_run[1] * kScaleLog2};
  float ts[2] = {0.0f, 0.0f};  // this tile's sums
  exp2_tile(s, neg_mc, ts);
  if (__any_sync(0xFFFFFFFFu, fmaxf(l_run[0] + ts[0], l_run[1] + ts[1]) > kFarSum || no_m)) return true;
  l_run[0] += ts[0];
  l_run[1] += ts[1];
  return false;
}

// P of a tile's 64 keys (acc's first 8 n-tiles) as the A fragments of the 4
// k-steps of O += P V (k-step kk: keys 16kk .. 16kk + 15).
template <int N>
__device__ __forceinline__ void pack_p(const float (&acc)[N][4], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    pa[t / 2][(t % 2) * 2] = ptx::pack_bf16(acc[t][0], acc[t][1]);
    pa[t / 2][(t % 2) * 2 + 1] = ptx::pack_bf16(acc[t][2], acc[t][3]);
  }
}

}  // namespace muse_decode::attn2_impl
