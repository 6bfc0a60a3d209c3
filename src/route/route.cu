// route's kernel: a cluster of b CTAs routes b <= 8 tokens (CTA t: token t)
// and, when asked, the cluster's first CTA builds the TRT-LLM-gen metadata of
// this rank's experts from every token's routes, published in its shared
// memory by each token's CTA (metadata.cuh).
//
// Latency is all that matters (at most 8 KB of logits), and each token's top 8
// is a dependent chain of instructions, so each token gets its own SM and the
// chain is kept short (one CTA with a warp per token takes 2.96-3.59 us, the
// 8 warps of one SM sharing its issue slots):
//  1. each of 8 warps takes 32 experts (one per lane) and ranks them by
//     (key, expert) with 32 shuffles of the 32-bit key (the expert is the
//     lane): its top 8 go to shared memory (select.cuh);
//  2. 64 threads rank the 64 finalists against each other: ranks 0..7 are the
//     slots (keys descending, then experts ascending; NaN first; select.cuh);
//  3. one warp sums the 8 scores left to right and writes ids and weights
//     (epilogue.cuh).
// The shapes: config.cuh. H200, graph replay with PDL, metadata on, L2
// flushed: 2.39-2.62 us for b = 1..8 (docs/route.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "config.cuh"
#include "epilogue.cuh"
#include "metadata.cuh"
#include "params.h"
#include "select.cuh"

namespace muse_decode::route_impl {
namespace {

template <bool kMetadata>
__global__ void __launch_bounds__(kThreads, 1) route_kernel(const Params p) {
  __shared__ float s_score[kNumExperts];    // this token's scores, by expert
  __shared__ uint64_t s_final[kFinalists];  // each warp's top 8
  __shared__ int s_slot_id[kTopK];          // this token's ids, slot order
  // Metadata (the first CTA of the cluster only; MetadataTables says what each holds):
  __shared__ uint32_t s_slot[kNumExperts][kSlotWords];
  __shared__ uint32_t s_sink;
  __shared__ uint64_t s_published;
  __shared__ uint32_t s_tokens[kNumExperts];
  __shared__ uint32_t s_routed[kNumExperts / 32];
  const MetadataTables tables{s_slot, &s_sink, &s_published, s_tokens, s_routed};

  const int t = blockIdx.x;  // the token; the cluster is the whole grid
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = threadIdx.x;  // this thread's expert
  // The bias does not depend on the previous kernel: load it before waiting.
  const float bias = p.bias[e];
  if (kMetadata) {
    if (t == 0) init_tables(tables, e, warp, lane);
    // "Started", and CTA 0's zeroed tables and initialised barrier visible to
    // the other CTAs' ORs: waited for before the first remote access. Every
    // thread of the CTA, all lanes of a warp together (.aligned).
    ptx::cluster_arrive_release();
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  keep_warp_top8(score_expert(p, t, e, bias, s_score), warp, lane, s_final);
  __syncthreads();
  rank_finalists(s_final, s_slot_id, threadIdx.x);
  __syncthreads();
  if (kMetadata) ptx::cluster_wait();  // every CTA of the cluster has started (every thread, as the arrival)
  Slot slot;
  bool elsewhere = false;  // (metadata) the slot's expert is another rank's
  if (warp == 0) {
    slot = weigh_slot(p, s_slot_id, s_score, lane);
    if (kMetadata && lane < kTopK) {
      const int j = slot.id - p.local_expert_offset;  // the route's local expert
      elsewhere = j < 0 || j >= p.num_local_experts;
      publish_route(tables, t, lane, j, elsewhere);
    }
  }
  if (warp == 0 && lane < kTopK) store_slot<kMetadata>(p, t, lane, slot, elsewhere);
  if constexpr (!kMetadata) return;

  // ---- metadata, in the cluster's first CTA ----
  if (t != 0) return;  // (its ORs need no wait: only CTA 0's shared memory is written, and CTA 0 waits)
  wait_published(tables);
  write_metadata(p, tables, threadIdx.x);
}

}  // namespace

int launch(const Params& p, Stream stream) {
  // With metadata the whole grid is one cluster.
  static_assert(kRouteMaxTokens <= detail::kPortableClusterSize, "a CTA per token in one portable cluster");
  const detail::LaunchShape shape{dim3(p.num_tokens), dim3(kThreads), 0, p.metadata ? p.num_tokens : 0, p.pdl};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return p.metadata ? detail::launch_kernel<route_kernel<true>>(shape, s, p)
                    : detail::launch_kernel<route_kernel<false>>(shape, s, p);
}

}  // namespace muse_decode::route_impl
