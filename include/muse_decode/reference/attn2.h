// CPU reference of attn2: the test oracle, written for clarity in double
// precision from the same bf16 inputs (docs/contract.md).
#pragma once

#include <cstdint>

namespace muse_decode::reference {

// The inputs of one attn2 call in host memory; bf16 tensors as their bit
// patterns (uint16_t), strides in elements.
struct Attn2Inputs {
  const uint16_t* q = nullptr;          // [R*8, KVH*8*64], row stride q_stride
  int64_t q_stride = 0;
  const uint16_t* gate = nullptr;       // [R*8, KVH*8*64], row stride gate_stride
  int64_t gate_stride = 0;
  const uint16_t* kv_cache = nullptr;   // [pages, KVH, 16, 128], contiguous
  int num_kv_heads = 0;
  const int32_t* block_table = nullptr; // [R, *], row stride block_table_stride
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;    // [R], 8 <= L (the contract; not checked here)
  int window = 0;                       // 0: none
};

// The value of a bf16 bit pattern.
double attn2_bf16_value(uint16_t bits);

// The 64 rows of request `req` and KV head `kv_head`:
// out[(token * 8 + g) * 64 + d] for head kv_head * 8 + g (doubles, before the
// final bf16 rounding). Scores, softmax, norm and gate all in double.
void attn2_pair(const Attn2Inputs& in, int req, int kv_head, double* out);

// Every request and KV head: out [R*8, KVH*8*64], row stride out_stride.
void attn2(const Attn2Inputs& in, int num_reqs, double* out, int64_t out_stride);

}  // namespace muse_decode::reference
