// CPU reference of attention_block: the references of the three ops
// composed, in the block's order (docs/contract.md), written for clarity.
#pragma once

#include <cstdint>

#include "muse_decode/constants.h"

namespace muse_decode::reference {

// The inputs of one attention_block call in host memory; bf16 tensors as
// their bit patterns (uint16_t), strides in elements. T = 8 * num_reqs rows,
// N = qkv_width(num_kv_heads), K = o_proj_in_width(num_kv_heads).
struct AttentionBlockInputs {
  const uint16_t* x = nullptr;              // [T, 8192], row stride x_stride
  int64_t x_stride = kHiddenSize;
  int num_reqs = 0;                         // R (the contract: 1..8; any R >= 1 here)
  const uint16_t* qkv_weight = nullptr;     // [N, 8192] contiguous
  int num_kv_heads = 0;                     // any count qkv_front's reference takes
  const int64_t* positions = nullptr;       // [T]; clamped into cos_sin
  const float* cos_sin = nullptr;           // fp32 [max_pos, 64]; null: a layer without RoPE
  int64_t max_pos = 0;
  const int64_t* slot_mapping = nullptr;    // [T]; a slot outside [0, num_pages * 16): no insert
  uint16_t* kv_cache = nullptr;             // [num_pages, KVH, 16, 128] contiguous: the insert writes it,
                                            // attention then reads it
  int64_t num_pages = 0;
  const int32_t* block_table = nullptr;     // [R, *], row stride block_table_stride (page ids not checked)
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;        // [R], 8 <= L (the contract; not checked here)
  int window = 0;                           // 0: none
  const uint16_t* o_proj_weight = nullptr;  // [8192, K] contiguous
};

// What the block computes on its way (for tests that look inside), each
// contiguous and optional (null: not kept).
struct AttentionBlockSteps {
  uint16_t* qkv = nullptr;       // [T, N]: qkv_front's out, the bf16 of its reference's values
  uint16_t* attn_out = nullptr;  // [T, K]: attn2's out, the bf16 of its reference's values (o_proj's x)
};

// The three references in a row, as the block chains the ops:
//  1. reference::qkv_front on the T rows, rounded to bf16 (through fp32, as
//     the kernel's fp32 values are): the rows [q | k | v | gate];
//  2. the insert: each row's k and v heads into its slot of the cache;
//  3. reference::attn2 of the R requests on the q and gate columns of those
//     rows and the cache, rounded to bf16 likewise;
//  4. reference::o_proj of those rows (fp32 sums, k ascending, one rounding).
// out: bf16 bits [T, 8192] with row stride out_stride (other elements
// untouched). The block's kernel sums in other fixed orders, so its bits may
// differ from these (the contract's bar is against attention_block_exact).
void attention_block(const AttentionBlockInputs& in, uint16_t* out, int64_t out_stride,
                     const AttentionBlockSteps& steps = {});

// Steps 1-3 as above (their bf16 roundings belong to the contract: the cache
// and attn2's input are bf16), then o_proj's sums in double, unrounded:
// y[t * 8192 + n] (the oracle the GPU tests measure the block's error
// against).
void attention_block_exact(const AttentionBlockInputs& in, double* y, const AttentionBlockSteps& steps = {});

}  // namespace muse_decode::reference
