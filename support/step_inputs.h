// The verify step's random inputs, as the muse-decode tool and
// examples/engine_step make them: normal random values at scales that keep
// every op's outputs of order 1, the RoPE table, and the step's positions
// and cache slots. Host code over the public API alone.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "muse_decode/constants.h"
#include "muse_decode/reference.h"

namespace muse_decode::support {

// Standard deviations of the random layer and step.
inline constexpr float kActivationScale = 1.0f;  // x, and the keys and values already in the cache
// A projection row of 8192 columns sums to N(0, (0.02 * sqrt(8192))^2 = 1.8^2).
inline constexpr float kQkvWeightScale = 0.02f;
// o_proj's rows of K = 1024 (TP8) sum to 0.03 * sqrt(1024) = 0.96 times the
// attention rows' RMS.
inline constexpr float kOProjWeightScale = 0.03f;
// Router logits N(0, 2^2): two thirds of the sigmoid scores in (0.12, 0.88).
inline constexpr float kLogitScale = 2.0f;
inline constexpr float kBiasScale = 0.02f;  // the router's expert bias

inline std::vector<float> random_f32(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// bf16 bit patterns of normal values.
inline std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = reference::float_to_bf16_bits(dist(rng));
  return v;
}

// The fp32 RoPE table [max_pos, 64] of a sliding layer (theta 500000, the
// rotated pairs interleaved): position p's cos in columns 0:32, sin in 32:64.
inline std::vector<float> rope_table(int max_pos) {
  std::vector<float> cs(size_t(max_pos) * 64);
  for (int p = 0; p < max_pos; ++p)
    for (int j = 0; j < 32; ++j) {
      const double a = p * std::pow(kRopeTheta, -2.0 * j / kHeadDim);
      cs[p * 64 + j] = float(std::cos(a));
      cs[p * 64 + 32 + j] = float(std::sin(a));
    }
  return cs;
}

// The 8 tokens of a request of `len` keys are its last positions, len - 8 ..
// len - 1; token i's cache slot is its page (through the request's
// block-table row) times 16 plus its row in the page.
inline void step_positions(int len, const int32_t* table_row, int64_t* positions, int64_t* slots) {
  for (int i = 0; i < kVerifyLen; ++i) {
    const int p = len - kVerifyLen + i;
    positions[i] = p;
    slots[i] = int64_t(table_row[p / kPageSize]) * kPageSize + p % kPageSize;
  }
}

}  // namespace muse_decode::support
