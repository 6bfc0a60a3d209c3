// CPU reference of o_proj: the contract (docs/contract.md) written out, in fp32 as the op
// defines it and in double for the tests' error measure.
#include <vector>

#include "muse_decode/reference/o_proj.h"

namespace muse_decode::reference {

void o_proj(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight, int in_width,
            uint16_t* out, int64_t out_stride) {
  std::vector<float> xr(in_width);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < in_width; ++k) xr[k] = bf16_bits_to_float(x[t * x_stride + k]);
    for (int n = 0; n < kOProjOutWidth; ++n) {
      const uint16_t* w = weight + static_cast<int64_t>(n) * in_width;
      float sum = 0.0f;
      for (int k = 0; k < in_width; ++k) sum += xr[k] * bf16_bits_to_float(w[k]);  // no contraction (-ffp-contract=off)
      out[t * out_stride + n] = float_to_bf16_bits(sum);
    }
  }
}

void o_proj_exact(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight, int in_width,
                  double* y) {
  std::vector<double> xr(in_width);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < in_width; ++k) xr[k] = bf16_bits_to_float(x[t * x_stride + k]);
    for (int n = 0; n < kOProjOutWidth; ++n) {
      const uint16_t* w = weight + static_cast<int64_t>(n) * in_width;
      double sum = 0.0;
      for (int k = 0; k < in_width; ++k) sum += xr[k] * bf16_bits_to_float(w[k]);
      y[static_cast<int64_t>(t) * kOProjOutWidth + n] = sum;
    }
  }
}

}  // namespace muse_decode::reference
