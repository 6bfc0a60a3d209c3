// CPU reference of attention_block: qkv_front's, attn2's and o_proj's
// references chained as the block chains the ops (docs/contract.md).
#include <vector>

#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference/attention_block.h"
#include "muse_decode/reference/attn2.h"
#include "muse_decode/reference/bf16.h"
#include "muse_decode/reference/o_proj.h"
#include "muse_decode/reference/qkv_front.h"

namespace muse_decode::reference {

namespace {

// The bf16 of a reference value, through fp32 as the kernels round theirs.
uint16_t to_bf16(double v) { return float_to_bf16_bits(static_cast<float>(v)); }

// Steps 1-3: attn2's rows [T, K] (bf16 bits) from the inputs, the cache
// written on the way; the front's rows into steps.qkv when kept.
std::vector<uint16_t> attention_rows(const AttentionBlockInputs& in, const AttentionBlockSteps& steps) {
  const int kvh = in.num_kv_heads;
  const int64_t T = static_cast<int64_t>(in.num_reqs) * kVerifyLen;
  const int64_t N = qkv_width(kvh), K = o_proj_in_width(kvh);
  // [q | k | v | gate]: q and gate 8 heads of 64 per KV head (K columns), k and v one.
  const int64_t k_col = K, v_col = K + int64_t{kvh} * kHeadDim, gate_col = K + 2 * int64_t{kvh} * kHeadDim;

  // 1. The front's rows.
  std::vector<double> y(T * N);
  qkv_front(in.x, in.x_stride, static_cast<int>(T), in.qkv_weight, kvh, in.positions, in.cos_sin, in.max_pos,
            y.data());
  std::vector<uint16_t> qkv(T * N);
  for (int64_t i = 0; i < T * N; ++i) qkv[i] = to_bf16(y[i]);

  // 2. The insert: slot s is row s % 16 of page s / 16, per KV head.
  const int64_t slots = in.num_pages * kPageSize;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = in.slot_mapping[t];
    if (s < 0 || s >= slots) continue;
    for (int kv = 0; kv < kvh; ++kv) {
      uint16_t* row = in.kv_cache + ((s / kPageSize * kvh + kv) * kPageSize + s % kPageSize) * kCacheRowWidth;
      for (int d = 0; d < kHeadDim; ++d) {
        row[d] = qkv[t * N + k_col + kv * kHeadDim + d];
        row[kHeadDim + d] = qkv[t * N + v_col + kv * kHeadDim + d];
      }
    }
  }

  // 3. Attention on the q and gate columns of those rows.
  Attn2Inputs a;
  a.q = qkv.data();
  a.q_stride = N;
  a.gate = qkv.data() + gate_col;
  a.gate_stride = N;
  a.kv_cache = in.kv_cache;
  a.num_kv_heads = kvh;
  a.block_table = in.block_table;
  a.block_table_stride = in.block_table_stride;
  a.seq_lens = in.seq_lens;
  a.window = in.window;
  std::vector<double> o(T * K);
  attn2(a, in.num_reqs, o.data(), K);
  std::vector<uint16_t> rows(T * K);
  for (int64_t i = 0; i < T * K; ++i) rows[i] = to_bf16(o[i]);

  if (steps.qkv != nullptr)
    for (int64_t i = 0; i < T * N; ++i) steps.qkv[i] = qkv[i];
  if (steps.attn_out != nullptr)
    for (int64_t i = 0; i < T * K; ++i) steps.attn_out[i] = rows[i];
  return rows;
}

}  // namespace

void attention_block(const AttentionBlockInputs& in, uint16_t* out, int64_t out_stride,
                     const AttentionBlockSteps& steps) {
  const std::vector<uint16_t> rows = attention_rows(in, steps);
  const int K = o_proj_in_width(in.num_kv_heads);
  o_proj(rows.data(), K, in.num_reqs * kVerifyLen, in.o_proj_weight, K, out, out_stride);
}

void attention_block_exact(const AttentionBlockInputs& in, double* y, const AttentionBlockSteps& steps) {
  const std::vector<uint16_t> rows = attention_rows(in, steps);
  const int K = o_proj_in_width(in.num_kv_heads);
  o_proj_exact(rows.data(), K, in.num_reqs * kVerifyLen, in.o_proj_weight, K, y);
}

}  // namespace muse_decode::reference
