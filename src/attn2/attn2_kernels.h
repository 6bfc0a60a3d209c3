// attn2's kernels as the host layer (attn2_host.cc) reaches them: the
// workspace layout, the launch entry and the one-time setup, defined in
// attn2.cu (in a build without CUDA, by the host layer as
// kCudaErrorNotSupported).
#pragma once

#include <cstdint>

#include "muse_decode/attn2.h"

namespace muse_decode::detail {

// Workspace of the split path: int32 ticket counters [R * KVH, 16] (one per
// CTA rank of a slice's cluster), padded to 256 bytes; then float2 (m, l)
// [R, KVH, splits, 64 rows]; then float O [R, KVH, splits, 64 rows, 64]
// (unnormalised, relative to m). The partials' words are stored inverted, 0
// meaning "not written in this launch"; every launch leaves all of it at 0.
constexpr int kAttn2MaxCluster = 16;
constexpr int64_t attn2_counter_bytes(int64_t pairs) { return (pairs * kAttn2MaxCluster * 4 + 255) / 256 * 256; }
constexpr int64_t attn2_partial_bytes(int64_t partial_rows) { return partial_rows * (2 + 64) * 4; }

// Enqueues the kernel instance for p's cluster size, slices and window; no
// argument checks. Returns the CUDA error as int.
int attn2_launch(const Attn2Params& p, Stream stream);

// Sets the kernels' attributes on the current device (dynamic shared memory,
// non-portable clusters of 16) and returns in *short_cluster_size the cluster
// size of the one-slice path: 16 where the GPU can place such a cluster, else
// 8. Returns the CUDA error as int.
int attn2_set_kernel_attributes(int* short_cluster_size);

// CTAs per SM and co-resident clusters of the kernel with clusters of
// cluster_size (8 or 16), after attn2_set_kernel_attributes (prepare_attn2's
// idle_last decision, and the benchmark's header).
int attn2_occupancy(int cluster_size, int* blocks_per_sm, int* max_clusters);

}  // namespace muse_decode::detail
