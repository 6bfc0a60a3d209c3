// attention_block's device layer as the host layer, the tools, the tests and
// the benchmarks reach it (through the internal include folder src/): the
// kernel's parameters, those of a checked call, the workspace's layout, the
// unchecked launch and the one-time setup. The kernel is defined in
// attention_block.cu; a build without CUDA answers its entries with
// kCudaErrorNotSupported (attention_block_host.cc).
#pragma once

#include <cstdint>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {
struct AttentionBlockArgs;
}  // namespace muse_decode

namespace muse_decode::attention_block_impl {

inline constexpr int kShares = 132;       // = kAttentionBlockShares
inline constexpr int kTokenGroup = 16;    // the front and o_proj take the rows 16 at a time
inline constexpr int kMinSlicePages = 8;  // a key slice holds at least one 8-page group at the longest row
inline constexpr int kMaxReqs = 8;

// The workspace, each part 256-byte aligned, in this order:
//   counters     uint32 [kCounterWords]: the launch epoch and the phases' arrivals
//   front        per token group: qkv_front's stream-K merge (its tile counters, then a 4 KB
//                partial per (tile + share))
//   qkv          bf16 [T, N]: the projection's rows (q | k | v | gate)
//   attn_part    per (request, KV head, slice): 64 rows x (m, l, 64 floats of O)
//   attn_out     bf16 [T, K]: the attention's output rows, o_proj's x
inline constexpr int kCounterWords = 1024;
// Within the counters: word kEpoch counts the launches that have ended on the
// workspace; two sets of kCounterSetWords phase counters from word
// kCounterSets, launch e counting in set e % 2 (config.cuh).
inline constexpr int kEpochWord = 0;
inline constexpr int kCounterSets = 16;
inline constexpr int kCounterSetWords = 256;
struct WorkspaceLayout {
  int64_t counters, front, front_group_bytes, qkv, attn_part, attn_out, total;
};
WorkspaceLayout workspace_layout(int num_reqs, int num_kv_heads, int num_splits);

// The kernel's parameters: every field is filled by params_of() alone.
struct Params {
  const void* x = nullptr;               // bf16 [T, 8192]
  int64_t x_stride = 0;                  // elements, multiple of 8
  const void* qkv_weight = nullptr;      // bf16 [N, 8192] contiguous
  const int64_t* positions = nullptr;    // [T]
  const float* cos_sin = nullptr;        // fp32 [max_pos, 64]; null: no RoPE
  int64_t max_pos = 0;
  const int64_t* slot_mapping = nullptr; // [T]
  void* kv_cache = nullptr;              // bf16 [num_pages, KVH, 16, 128] contiguous
  int num_pages = 0;
  const int32_t* block_table = nullptr;  // [R, max_pages]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;     // [R]
  const void* o_weight = nullptr;        // bf16 [8192, K] contiguous
  void* out = nullptr;                   // bf16 [T, 8192]
  int64_t out_stride = 0;                // elements, multiple of 8
  void* workspace = nullptr;             // workspace_layout(R, KVH, num_splits), zeroed once
  int num_reqs = 0;                      // R, 1..8 (T = 8 R)
  int num_kv_heads = 0;                  // 2 or 4
  int max_model_len = 0;
  int window = 0;                        // 0: none
  int num_splits = 1;                    // key slices per (request, KV head): splits_of()
  int grid = 0;                          // CTAs launched (one per SM, at most kShares)
  WorkspaceLayout ws{};                  // workspace_layout(num_reqs, num_kv_heads, num_splits)
};

// Key slices per (request, KV head) (attention_block_splits, unchecked).
int splits_of(int num_reqs, int num_kv_heads, int max_model_len, int window);

// Checks every argument of a call (std::invalid_argument naming it) and
// returns the kernel's parameters for a grid of `grid` CTAs; launches nothing.
Params params_of(const AttentionBlockArgs& args, int grid);

// Enqueues the kernel (a cooperative launch of p.grid CTAs); no argument
// checks. Returns the CUDA error as int.
int launch(const Params& p, Stream stream);

// Sets the kernel's attributes on the current device and returns in *grid
// the CTAs it launches there: one per SM, at most kShares, 0 where one CTA
// per SM does not fit. Returns the CUDA error as int.
int set_kernel_attributes(int* grid);

}  // namespace muse_decode::attention_block_impl
