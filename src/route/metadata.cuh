// The routing metadata (docs/contract.md) of this rank's experts, built in
// the cluster's first CTA from every token's routes: each token's CTA
// publishes its local routes into CTA 0's tables (the slot of each route,
// and the expert/token bitmaps) by red.async ORs that CTA 0 counts on one
// mbarrier; CTA 0 then writes every field, thread j for local expert j.
//
// count <= num_tokens <= 8 <= tile_n: an expert with routes has exactly one
// CTA, whose index is the number of routed local experts below it, so no
// prefix sum over counts is needed, only population counts of one bitmap.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"

namespace muse_decode::route_impl {

static_assert(kRouteMaxTokens <= 8, "one CTA per local expert needs count <= the smallest tile_n (8)");

// CTA 0's tables, in its shared memory (the kernel declares them).
struct MetadataTables {
  uint32_t (*slot)[kSlotWords];  // [256][2]: byte t % 4 of word t / 4: slot of local expert j in token t's ids
  uint32_t* sink;                // target of other ranks' routes' ORs (of 0)
  uint64_t* published;           // phase 0 ends once every token's ORs landed
  uint32_t* tokens;              // [256]: bit t: token t routes to local expert j
  uint32_t* routed;              // [8]: bit j: local expert j has routes
};

// The shared::cluster address of `p` (this CTA's shared memory) in CTA 0.
__device__ __forceinline__ uint32_t in_cta0(const void* p) { return ptx::map_to_rank(ptx::smem_addr(p), 0); }

// CTA 0, every thread (e: its expert), before griddepcontrol.wait: the
// tables zeroed and the barrier armed for every CTA's bytes. Lane 0 of warp
// 0 inits the barrier, fences the init and arrives expecting every CTA's
// bytes. ptxas issues the init on the uniform datapath, once for the whole
// warp, which racecheck counts as a write by each of its 32 lanes: the warp
// barrier orders those before lane 0's arrival (without it racecheck warns).
// It is one WARPSYNC in warp 0 of CTA 0, before griddepcontrol.wait.
__device__ __forceinline__ void init_tables(const MetadataTables& tb, int e, int warp, int lane) {
  tb.tokens[e] = 0u;
  if (e < kNumExperts / 32) tb.routed[e] = 0u;
  tb.slot[e][0] = 0u;
  tb.slot[e][1] = 0u;
  if (warp == 0 && gridDim.x > 1) {
    if (lane == 0) ptx::mbar_init(tb.published, 1);
    __syncwarp();
    if (lane == 0) {
      ptx::fence_mbarrier_init();
      ptx::mbar_arrive_expect_tx(tb.published, gridDim.x * kPublishBytes);
    }
  }
}

// Lane k < 8 of warp 0 of token t's CTA, once every CTA of the cluster has
// started: slot k's route into CTA 0's tables, so that CTA 0 starts on them
// as soon as its barrier says every token's ORs landed. j: the route's local
// expert; `elsewhere`: the expert is another rank's (j is out of range), and
// the route ORs 0 into the sink, so that every token's CTA sends the same
// bytes.
__device__ __forceinline__ void publish_route(const MetadataTables& tb, int t, int lane, int j, bool elsewhere) {
  if (gridDim.x == 1) {
    // One token, no cluster of two or more (red.async needs one): CTA 0's
    // own tables by shared atomics, ordered by the CTA barrier of
    // wait_published.
    if (!elsewhere) {
      atomicOr(&tb.slot[j][0], static_cast<uint32_t>(lane));
      atomicOr(&tb.tokens[j], 1u);
      atomicOr(&tb.routed[j / 32], 1u << (j % 32));
    }
  } else {
    const uint32_t bar = in_cta0(tb.published);
    if (!elsewhere) {
      ptx::red_async_or(in_cta0(&tb.slot[j][t / 4]), static_cast<uint32_t>(lane) << (8 * (t % 4)), bar);
      ptx::red_async_or(in_cta0(&tb.tokens[j]), 1u << t, bar);
      ptx::red_async_or(in_cta0(&tb.routed[j / 32]), 1u << (j % 32), bar);
    } else {
      const uint32_t sink = in_cta0(tb.sink);
      for (int k = 0; k < 3; ++k) ptx::red_async_or(sink, 0u, bar);
    }
  }
}

// CTA 0, every thread: until every token's routes are in the tables. The
// other CTAs need no wait: their ORs write only CTA 0's shared memory.
__device__ __forceinline__ void wait_published(const MetadataTables& tb) {
  if (gridDim.x == 1)
    __syncthreads();
  else
    ptx::mbar_wait<true>(ptx::smem_addr(tb.published), 0);  // phase 0
}

// Local expert j's CTA index (routed local experts below j) and the number
// of CTAs (routed local experts).
struct ExpertCta {
  int cta = 0;
  int total = 0;
};
__device__ __forceinline__ ExpertCta cta_of_expert(const uint32_t* routed, int j) {
  ExpertCta c;
#pragma unroll
  for (int w = 0; w < kNumExperts / 32; ++w) {
    const uint32_t bits = routed[w];
    c.total += __popc(bits);
    c.cta += w < j / 32 ? __popc(bits) : w == j / 32 ? __popc(bits & ((1u << (j % 32)) - 1u)) : 0;
  }
  return c;
}

// Local expert j (with routes, `tokens` its token mask): its CTA entry and
// its routes' permuted indices (tokens ascending).
__device__ __forceinline__ void write_expert_routes(const Params& p, const MetadataTables& tb, int j, int cta,
                                                    uint32_t tokens) {
  int32_t* const md = p.metadata;
  const int tile = p.tile_n;
  md[kMetaCtaBatch + cta] = j;
  md[kMetaCtaLimit + cta] = cta * tile + __popc(tokens);  // = min((g + 1) * tile, ...) as count <= tile
  uint32_t rest = tokens;
#pragma unroll
  for (int n = 0; n < kRouteMaxTokens; ++n, rest &= rest - 1u) {
    if (rest == 0u) break;
    const int tok = __ffs(rest) - 1;
    const int slot = (tb.slot[j][tok / 4] >> (8 * (tok % 4))) & 0xFF;
    md[kMetaExpandedToPermuted + tok * kTopK + slot] = cta * tile + n;
  }
}

// permuted_idx_to_token_idx for every row below total * tile, 16 bytes per
// store: CTA g's first rows are the tokens of the g-th routed expert
// (ascending; count <= 8 rows), written by that expert's thread; every other
// row is -1, written by all threads together.
__device__ __forceinline__ void write_permuted_rows(const Params& p, int j, const ExpertCta& c, uint32_t tokens) {
  int4* const rows = reinterpret_cast<int4*>(p.metadata + kMetaPermutedToToken);
  const int quads_log2 = __ffs(p.tile_n) - 3;  // log2(tile / 4); tile >= 8: the first 2 quads hold the tokens
  if (tokens != 0u) {
    uint32_t m = tokens;
    int out[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      out[q] = m ? __ffs(m) - 1 : -1;
      m &= m - 1u;
    }
    rows[(c.cta << quads_log2) + 0] = make_int4(out[0], out[1], out[2], out[3]);
    rows[(c.cta << quads_log2) + 1] = make_int4(out[4], out[5], out[6], out[7]);
  }
  const int quads = 1 << quads_log2;
  for (int v = j; v < (c.total << quads_log2); v += kThreads)
    if ((v & (quads - 1)) >= 2) rows[v] = make_int4(-1, -1, -1, -1);
}

// CTA 0, every thread (thread j: local expert j), after wait_published.
__device__ __forceinline__ void write_metadata(const Params& p, const MetadataTables& tb, int j) {
  int32_t* const md = p.metadata;
  const ExpertCta c = cta_of_expert(tb.routed, j);
  if (j == 0) {
    md[kMetaNumCtas] = c.total;
    md[kMetaPaddedTokens] = c.total * p.tile_n;
  }
  const uint32_t tokens = j < p.num_local_experts ? tb.tokens[j] : 0u;
  if (tokens != 0u) write_expert_routes(p, tb, j, c.cta, tokens);
  write_permuted_rows(p, j, c, tokens);
}

}  // namespace muse_decode::route_impl
