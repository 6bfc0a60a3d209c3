// CPU reference of o_proj: the test oracle, written for clarity.
#pragma once

#include <cstdint>

#include "muse_decode/o_proj.h"
#include "muse_decode/reference/bf16.h"

namespace muse_decode::reference {

// The op as the contract defines it: out[t, n] = bf16(sum_k x[t, k] *
// weight[n, k]), the products and their sum in fp32 (k ascending), rounded
// once to bf16. x: bf16 bits [num_tokens, in_width] with row stride x_stride
// elements; weight: bf16 bits [8192, in_width] contiguous; out: bf16 bits
// [num_tokens, 8192] with row stride out_stride (other elements untouched).
// The kernel sums in another fixed order, so its bits may differ from these in
// the last place.
void o_proj(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight, int in_width,
            uint16_t* out, int64_t out_stride);

// The same sums in double, unrounded: y[t * 8192 + n] (the fp64 oracle the
// GPU tests measure the kernel's error against).
void o_proj_exact(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight, int in_width,
                  double* y);

}  // namespace muse_decode::reference
