// attn2's device layer as the host layer, the tools, the tests and the
// benchmarks reach it (through the internal include folder src/): the kernel
// parameters, the parameters of a checked call, the unchecked launch, the
// workspace layout and the one-time setup. The kernels are defined in
// attn2.cu; a build without CUDA answers their entries with
// kCudaErrorNotSupported (attn2_host.cc).
#pragma once

#include <cstdint>

#include "muse_decode/tensor.h"

namespace muse_decode {
struct Attn2Args;
struct Attn2Residency;
}  // namespace muse_decode

namespace muse_decode::attn2_impl {

// The kernel's parameters: every field is filled by params_of() alone.
struct Params {
  const void* q = nullptr;            // bf16 [R*8, H*64]
  int64_t q_stride = 0;               // elements between rows, multiple of 8
  const void* gate = nullptr;         // bf16 [R*8, H*64]
  int64_t gate_stride = 0;            // elements between rows, multiple of 8
  const void* kv_cache = nullptr;     // bf16 [num_pages, KVH, 16, 128], contiguous, 16-byte aligned
  int num_pages = 0;                  // page ids outside [0, num_pages) are contract breaks (NaN rows)
  const int32_t* block_table = nullptr;  // [R, >= ceil(max_model_len / 16)]
  int64_t block_table_stride = 0;     // elements between rows
  const int32_t* seq_lens = nullptr;  // [R]
  void* out = nullptr;                // bf16 [R*8, H*64]
  int64_t out_stride = 0;             // elements between rows, multiple of 8
  void* workspace = nullptr;          // attn2_workspace_bytes(R, KVH, num_splits) bytes; null when num_splits == 1
  int num_reqs = 0;                   // R, 1..65535
  int num_kv_heads = 0;               // KVH, 1..16
  int max_model_len = 0;              // L > max_model_len is a contract break (NaN rows)
  int window = 0;                     // 0: none; else keys p - window + 1 .. p
  int num_splits = 1;                 // clusters per (request, KV head), 1..32
  int cluster_size = 8;               // CTAs per cluster: 16 for one slice or 1-2 KV heads where the GPU places
                                      // a cluster of 16, else 8
  bool pdl = false;                   // programmatic dependent launch
  bool idle_last = false;             // the split grid fills the GPU exactly: its last cluster (placed last)
                                      // takes fewer keys (none at shorter L)
  bool resident = false;              // the whole split grid fits on the GPU at once: one slice merges by
                                      // polling the others' partials, no ticket
};

// Checks every argument of a call (std::invalid_argument naming it, with the
// expected and the actual value) and returns the kernel's parameters for a
// device of that residency (attn2_residency): the cluster size where the GPU
// cannot place 16, idle_last and resident follow from it. Launches nothing
// and needs no GPU.
Params params_of(const Attn2Args& args, const Attn2Residency& residency);

// The checks of the deployment's scalars and of the block table
// (std::invalid_argument naming the argument), which attention_block shares:
// max_model_len >= 8; window 0 or in [1, max_model_len); block_table int32
// [num_reqs, >= ceil(max_model_len / 16)] on CUDA device `device`, unit
// column stride, rows apart by at least their width, 4-byte aligned.
void check_max_model_len(int max_model_len);
void check_window(int window, int max_model_len);
void check_block_table(const TensorRef& block_table, int num_reqs, int max_model_len, int device);

// Enqueues the kernel instance for p's cluster size, slices and window; no
// argument checks. Returns the CUDA error as int.
int launch(const Params& p, Stream stream);

// Workspace of the split path: int32 ticket counters [R * KVH, 16] (one per
// CTA rank of a slice's cluster), padded to 256 bytes; then float2 (m, l)
// [R, KVH, splits, 64 rows]; then float O [R, KVH, splits, 64 rows, 64]
// (unnormalised, relative to m). The partials' words are stored inverted, 0
// meaning "not written in this launch"; every launch leaves all of it at 0.
constexpr int kMaxCluster = 16;
constexpr int64_t counter_bytes(int64_t pairs) { return (pairs * kMaxCluster * 4 + 255) / 256 * 256; }
constexpr int64_t partial_bytes(int64_t partial_rows) { return partial_rows * (2 + 64) * 4; }

// Sets the kernels' attributes on the current device (dynamic shared memory,
// non-portable clusters of 16) and returns in *short_cluster_size the cluster
// size of the one-slice path: 16 where the GPU can place such a cluster, else
// 8. Returns the CUDA error as int.
int set_kernel_attributes(int* short_cluster_size);

// CTAs per SM and co-resident clusters of the kernel with clusters of
// cluster_size (8 or 16), after set_kernel_attributes (prepare_attn2's
// residency, and the benchmark's header).
int occupancy(int cluster_size, int* blocks_per_sm, int* max_clusters);

}  // namespace muse_decode::attn2_impl
