// Random inputs of the CPU tests of the references: bf16 bits uniform in
// [-scale, scale], and the interleaved RoPE table of Muse Spark's theta.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "muse_decode/constants.h"
#include "muse_decode/reference/bf16.h"

namespace muse_decode::testing {

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = reference::float_to_bf16_bits(u(rng));
  return v;
}

// fp32 [max_pos, 64]: cos of each pair's angle, then its sin.
inline std::vector<float> rope_table(int max_pos) {
  std::vector<float> t(static_cast<size_t>(max_pos) * 64);
  for (int p = 0; p < max_pos; ++p)
    for (int j = 0; j < 32; ++j) {
      const double inv_freq = std::pow(kRopeTheta, -2.0 * j / 64.0);
      t[p * 64 + j] = static_cast<float>(std::cos(p * inv_freq));
      t[p * 64 + 32 + j] = static_cast<float>(std::sin(p * inv_freq));
    }
  return t;
}

}  // namespace muse_decode::testing
