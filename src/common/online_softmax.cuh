// The online softmax's partial state and its merge: every step of attention
// that joins sums taken against different maxima (a tile's keys into the
// running state, two key halves, a cluster's ranks, a split's slices) goes
// through merge_weights() or State, so the -inf guard lives here once.
//
// A partial of a row is (m, l, o): the largest score it has seen (m), the
// softmax sum against it (l = sum of exp2((s - m) c)) and the unnormalised
// output against it (o = sum of exp2((s - m) c) v). `scale` (c) takes m's
// units to log2 units: the softmax scale times log2(e) where m is a raw
// score, 1 where m is already in the log2 domain.
#pragma once

#include <cmath>

#include "ptx.cuh"

namespace muse_decode::softmax {

// The reference sums are taken against once the max is m: m itself, or 0
// where nothing is visible yet (m = -inf), so that every weight is then
// exp2(-inf) = 0, never exp2(-inf + inf) = NaN.
__device__ __forceinline__ float reference(float m) { return m == -INFINITY ? 0.0f : m; }

// The factor that takes sums against max m_part to sums against `ref` (a
// reference() of a max >= m_part).
__device__ __forceinline__ float weight(float m_part, float ref, float scale) {
  return ptx::exp2_approx((m_part - ref) * scale);
}

// Two partials' common max and each one's weight against it.
struct MergeWeights {
  float m, a, b;
};
__device__ __forceinline__ MergeWeights merge_weights(float m_a, float m_b, float scale) {
  const float m = fmaxf(m_a, m_b);
  const float ref = reference(m);
  return {m, weight(m_a, ref, scale), weight(m_b, ref, scale)};
}

// A partial of one row, N of its columns in this thread.
template <int N>
struct State {
  float m = -INFINITY;
  float l = 0.0f;
  float o[N] = {};

  // b into this state: (m, l, o) of the union of their keys.
  __device__ __forceinline__ void merge(const State& b, float scale) {
    const MergeWeights w = merge_weights(m, b.m, scale);
    m = w.m;
    l = w.a * l + w.b * b.l;
#pragma unroll
    for (int c = 0; c < N; ++c) o[c] = w.a * o[c] + w.b * b.o[c];
  }

  // Several partials at once (a cluster's ranks, a round of slices): first
  // the max over this state and all of them (m_all), then each one's
  // weight(m_k, ref) added in a fixed order. take_max returns the reference
  // of m_all, with this state's own sums taken to it.
  __device__ __forceinline__ float take_max(float m_all, float scale) {
    const float ref = reference(m_all);
    const float a = weight(m, ref, scale);
    m = m_all;
    l *= a;
#pragma unroll
    for (int c = 0; c < N; ++c) o[c] *= a;
    return ref;
  }
  // (This state empty: nothing added yet.) The same without the rescale.
  __device__ __forceinline__ float start_at(float m_all) {
    m = m_all;
    return reference(m_all);
  }
  // A partial (l_k, o_k * o_scale) of weight w against this state's max.
  __device__ __forceinline__ void add(float w, float l_k, const float (&o_k)[N], float o_scale = 1.0f) {
    l = fmaf(w, l_k, l);
    const float wo = w * o_scale;
#pragma unroll
    for (int c = 0; c < N; ++c) o[c] = fmaf(wo, o_k[c], o[c]);
  }
};

}  // namespace muse_decode::softmax
