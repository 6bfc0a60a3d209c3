// CPU reference of qkv_front: the test oracle, in double precision from the
// same bf16 inputs, written for clarity.
#pragma once

#include <cstdint>

#include "muse_decode/reference/bf16.h"

#include "muse_decode/qkv_front.h"

namespace muse_decode::reference {

// y[t, n] = sum_k x[t, k] * weight[n, k] in double for t < num_tokens and
// n < qkv_width(num_kv_heads). x: bf16 bits [num_tokens, 8192] with row stride
// x_stride elements; weight: bf16 bits [N, 8192] contiguous; y: [num_tokens, N].
void qkv_projection(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight,
                    int num_kv_heads, double* y);

// The epilogue on y [num_tokens, N] in place (docs/contract.md): every q
// and k head (64 values) divided by sqrt(mean(y^2) + 1e-5), then, when cos_sin
// is given (fp32 [max_pos, 64]), the pairs (2j, 2j+1) of q and k rotated by
// c = cos_sin[pos, j], s = cos_sin[pos, 32 + j]; positions outside the table
// are clamped into it, as the kernel does. v and gate are left as they are.
void qkv_front_epilogue(double* y, int num_tokens, int num_kv_heads, const int64_t* positions,
                        const float* cos_sin, int64_t max_pos);

// Both steps: y = the values out holds before its rounding to bf16. The KV
// cache gets, for each token with a slot, the bf16 of y's k and v heads.
void qkv_front(const uint16_t* x, int64_t x_stride, int num_tokens, const uint16_t* weight,
               int num_kv_heads, const int64_t* positions, const float* cos_sin, int64_t max_pos,
               double* y);


}  // namespace muse_decode::reference
