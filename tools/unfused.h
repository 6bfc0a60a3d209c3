// The unfused verify step the tool compares with: cuBLAS for the GEMM and
// plain, one-job-per-kernel CUDA kernels for the rest, written for clarity
// (not speed), as an engine without the fused kernels would run them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace muse_decode::tool {

// bf16 y [T, N] = x [T, 8192] W^T (cuBLAS), then q/k weightless RMS norm and
// interleaved RoPE (cos_sin may be null), then the k/v cache insert.
struct UnfusedFrontArgs {
  const void* x;            // bf16 [T, 8192]
  const void* weight;       // bf16 [N, 8192]
  const int64_t* positions; // [T]
  const float* cos_sin;     // [max_pos, 64] or null
  const int64_t* slots;     // [T]; -1: none
  void* kv_cache;           // bf16 [pages, KVH, 16, 128]
  void* out;                // bf16 [T, N]
  int tokens, num_kv_heads;
};
void unfused_front(const UnfusedFrontArgs& a, void* cublas_handle, cudaStream_t stream);

// bf16 out [T, 8192] = x [T, K] W^T (cuBLAS, fp32 accumulation): the
// attention output projection as the stock path runs it.
struct UnfusedOProjArgs {
  const void* x;            // bf16 [T, K] contiguous
  const void* weight;       // bf16 [8192, K]
  void* out;                // bf16 [T, 8192]
  int tokens, in_width;
};
void unfused_o_proj(const UnfusedOProjArgs& a, void* cublas_handle, cudaStream_t stream);

// Paged attention of the 8 rows of each request (one block per row and head),
// then the o-norm and sigmoid gate (a second kernel).
struct UnfusedAttentionArgs {
  const void* q;            // bf16 [R*8, H*64], row stride q_stride
  const void* gate;         // bf16 [R*8, H*64], row stride gate_stride
  int64_t q_stride, gate_stride;
  const void* kv_cache;     // bf16 [pages, KVH, 16, 128]
  const int32_t* block_table;  // [R, table_stride]
  int64_t table_stride;
  const int32_t* seq_lens;  // [R]
  float* scratch;           // fp32 [R*8, H*64]
  void* out;                // bf16 [R*8, H*64]
  int reqs, num_kv_heads, window;
};
void unfused_attention(const UnfusedAttentionArgs& a, cudaStream_t stream);

// Routing: sigmoid and bias, top-8 by repeated arg-max, weights; then the
// metadata by one thread, as a plain permutation kernel would.
struct UnfusedRouteArgs {
  const float* logits;      // [b, 256]
  const float* bias;        // [256]
  int32_t* ids;             // [b, 8]
  float* weights;           // [b, 8]
  int32_t* metadata;        // the layout of muse_decode/route.h
  int tokens, local_expert_offset, num_local_experts, tile_n;
};
void unfused_route(const UnfusedRouteArgs& a, cudaStream_t stream);

}  // namespace muse_decode::tool
