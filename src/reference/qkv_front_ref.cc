// CPU reference of qkv_front: the contract (docs/contract.md) written out in double.
#include <cmath>
#include <cstring>

#include "muse_decode/reference/qkv_front.h"

namespace muse_decode::reference {

void qkv_projection(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight,
                    int num_kv_heads, double* y) {
  const int n = qkv_width(num_kv_heads);
  double xr[kHiddenSize];
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < kHiddenSize; ++k) xr[k] = bf16_bits_to_float(x[t * x_stride + k]);
    for (int j = 0; j < n; ++j) {
      const uint16_t* w = weight + static_cast<int64_t>(j) * kHiddenSize;
      double sum = 0.0;
      for (int k = 0; k < kHiddenSize; ++k) sum += xr[k] * bf16_bits_to_float(w[k]);
      y[static_cast<int64_t>(t) * n + j] = sum;
    }
  }
}

void qkv_front_epilogue(double* y, int num_tokens, int num_kv_heads, const int64_t* positions,
                        const float* cos_sin, int64_t max_pos) {
  const int n = qkv_width(num_kv_heads);
  const int q_heads = kHeadsPerKvHead * num_kv_heads;
  for (int t = 0; t < num_tokens; ++t) {
    // q heads, then k heads: columns [0, (q_heads + num_kv_heads) * 64).
    for (int h = 0; h < q_heads + num_kv_heads; ++h) {
      double* v = y + static_cast<int64_t>(t) * n + h * kHeadDim;
      double ss = 0.0;
      for (int d = 0; d < kHeadDim; ++d) ss += v[d] * v[d];
      const double scale = 1.0 / std::sqrt(ss / kHeadDim + static_cast<double>(kRmsNormEps));
      for (int d = 0; d < kHeadDim; ++d) v[d] *= scale;
      if (cos_sin == nullptr) continue;
      int64_t pos = positions[t];
      if (pos < 0) pos = 0;
      if (pos >= max_pos) pos = max_pos - 1;
      const float* cs = cos_sin + pos * kHeadDim;
      for (int j = 0; j < kHeadDim / 2; ++j) {
        const double c = cs[j], s = cs[kHeadDim / 2 + j];
        const double a = v[2 * j], b = v[2 * j + 1];
        v[2 * j] = a * c - b * s;
        v[2 * j + 1] = a * s + b * c;
      }
    }
  }
}

void qkv_front(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight,
               int num_kv_heads, const int64_t* positions, const float* cos_sin, int64_t max_pos,
               double* y) {
  qkv_projection(x, x_stride, num_tokens, weight, num_kv_heads, y);
  qkv_front_epilogue(y, num_tokens, num_kv_heads, positions, cos_sin, max_pos);
}

}  // namespace muse_decode::reference
