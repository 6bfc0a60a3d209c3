// CPU reference of attn2: straight from the contract (docs/contract.md), in double precision.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "muse_decode/constants.h"
#include "muse_decode/reference/attn2.h"
#include "muse_decode/reference/bf16.h"

namespace muse_decode::reference {

double attn2_bf16_value(uint16_t bits) { return bf16_bits_to_float(bits); }

void attn2_pair(const Attn2Inputs& in, int req, int kv_head, double* out) {
  constexpr int D = kHeadDim, G = kHeadsPerKvHead, T = kVerifyLen;
  const int L = in.seq_lens[req];
  const int32_t* table = in.block_table + static_cast<int64_t>(req) * in.block_table_stride;
  // K (v = false) or V (v = true) of key j of this request and KV head.
  auto key_row = [&](int j, bool v) {
    const int64_t page = table[j / kPageSize];
    return in.kv_cache + ((page * in.num_kv_heads + kv_head) * kPageSize + j % kPageSize) * kCacheRowWidth +
           (v ? D : 0);
  };
  std::vector<double> q(D), kd(D), scores;
  for (int i = 0; i < T; ++i) {
    const int pos = L - T + i;
    const int lo = in.window > 0 ? std::max(0, pos - in.window + 1) : 0;
    for (int g = 0; g < G; ++g) {
      const int64_t row = static_cast<int64_t>(req) * T + i;
      const int64_t col = static_cast<int64_t>(kv_head * G + g) * D;
      for (int d = 0; d < D; ++d) q[d] = attn2_bf16_value(in.q[row * in.q_stride + col + d]);
      // score_j = scale * dot(q, K_j) for lo <= j <= pos; softmax.
      scores.assign(pos - lo + 1, 0.0);
      double m = -INFINITY;
      for (int j = lo; j <= pos; ++j) {
        const uint16_t* k = key_row(j, false);
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += q[d] * attn2_bf16_value(k[d]);
        scores[j - lo] = 0.6841258107984375 * dot;  // 64^-0.5 * 5.4730064863875
        m = std::max(m, scores[j - lo]);
      }
      double sum = 0.0;
      for (double& s : scores) sum += (s = std::exp(s - m));
      std::vector<double> o(D, 0.0);
      for (int j = lo; j <= pos; ++j) {
        const uint16_t* v = key_row(j, true);
        const double a = scores[j - lo] / sum;
        for (int d = 0; d < D; ++d) o[d] += a * attn2_bf16_value(v[d]);
      }
      // out = sigmoid(gate) * o * rsqrt(mean(o^2) + eps)
      double ms = 0.0;
      for (int d = 0; d < D; ++d) ms += o[d] * o[d];
      const double rms = 1.0 / std::sqrt(ms / D + static_cast<double>(kRmsNormEps));
      for (int d = 0; d < D; ++d) {
        const double gv = attn2_bf16_value(in.gate[row * in.gate_stride + col + d]);
        out[(i * G + g) * D + d] = o[d] * rms / (1.0 + std::exp(-gv));
      }
    }
  }
}

void attn2(const Attn2Inputs& in, int num_reqs, double* out, int64_t out_stride) {
  constexpr int D = kHeadDim, G = kHeadsPerKvHead, T = kVerifyLen;
  std::vector<double> pair(T * G * D);
  for (int r = 0; r < num_reqs; ++r)
    for (int kv = 0; kv < in.num_kv_heads; ++kv) {
      attn2_pair(in, r, kv, pair.data());
      for (int i = 0; i < T; ++i)
        for (int g = 0; g < G; ++g)
          for (int d = 0; d < D; ++d)
            out[(static_cast<int64_t>(r) * T + i) * out_stride + (kv * G + g) * D + d] = pair[(i * G + g) * D + d];
    }
}

}  // namespace muse_decode::reference
