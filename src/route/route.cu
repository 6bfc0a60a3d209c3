// route's kernel: a cluster of b CTAs routes b <= 8 tokens (CTA t: token t)
// and, when asked, the cluster's first CTA builds the TRT-LLM-gen metadata of
// this rank's experts from every token's routes, published in its shared
// memory by each token's CTA (the slot of each local route, and the
// expert/token bitmaps, by red.async ORs that CTA 0 counts on one mbarrier).
//
// Latency is all that matters (at most 8 KB of logits), and each token's top 8
// is a dependent chain of instructions, so each token gets its own SM and the
// chain is kept short:
//  1. each of 8 warps takes 32 experts (one per lane) and ranks them by
//     (key, expert) with 32 shuffles of the 32-bit key (the expert is the
//     lane): its top 8 go to shared memory;
//  2. 64 threads rank the 64 finalists against each other: ranks 0..7 are the
//     slots (keys descending, then experts ascending; NaN first);
//  3. one warp sums the 8 scores left to right and writes ids and weights.
// H200, graph replay with PDL, metadata on, L2 flushed: 2.39-2.62 us for
// b = 1..8. One CTA with a warp per token ran 2.96-3.59 us, the 8 warps of
// one SM sharing its issue slots.
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "muse_decode/route.h"  // the metadata layout of the contract
#include "params.h"

namespace muse_decode::route_impl {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kFinalists = kWarps * kTopK;  // 64
constexpr unsigned kAll = 0xFFFFFFFFu;
static_assert(kThreads == kNumExperts, "one thread per expert (and per local expert in the metadata)");
static_assert(kFinalists <= kThreads, "one thread per finalist");

// A candidate as one word that orders like the contract's step 3 (docs/contract.md): the key as an
// order-preserving integer in the upper half (NaN above every number, -0 equal
// to +0), 255 - expert in the lower half, so equal keys rank the lower expert
// first. Words are unique (one per expert): ranks are a permutation.
__device__ __forceinline__ uint64_t candidate(float key, int expert) {
  uint32_t ord;
  if (key != key) {
    ord = 0xFFFFFFFFu;
  } else {
    const uint32_t u = key == 0.0f ? 0u : __float_as_uint(key);
    ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return (static_cast<uint64_t>(ord) << 32) | static_cast<uint32_t>(kNumExperts - 1 - expert);
}
__device__ __forceinline__ int expert_of(uint64_t c) { return kNumExperts - 1 - static_cast<int>(c & 0xFFFFFFFFu); }

// The shared::cluster address of `p` (this CTA's shared memory) in CTA 0.
__device__ __forceinline__ uint32_t in_cta0(const void* p) { return ptx::map_to_rank(ptx::smem_addr(p), 0); }
// Each token's CTA publishes its 8 routes into CTA 0's tables with three
// red.async ORs per route (other ranks' routes OR 0 into a sink word), so
// CTA 0 expects a fixed byte count on one mbarrier and waits for it alone:
// remote atomics and a second cluster barrier, whose release compiles to a
// MEMBAR.ALL.GPU on every thread, cost 0.14 us more per call at every b
// (H200).
constexpr uint32_t kPublishBytes = kTopK * 3 * 4;  // per token

template <bool kMetadata>
__global__ void __launch_bounds__(kThreads, 1) route_kernel(const Params p) {
  __shared__ float s_score[kNumExperts];           // this token's scores, by expert
  __shared__ uint64_t s_final[kFinalists];         // each warp's top 8
  __shared__ int s_slot_id[kTopK];                 // this token's ids, slot order
  // Metadata (the first CTA of the cluster only):
  __shared__ uint32_t s_slot[kNumExperts][kRouteMaxTokens / 4];  // byte t % 4 of word t / 4: slot of local expert j in token t's ids
  __shared__ uint32_t s_sink;                                      // target of other ranks' routes' ORs (of 0)
  __shared__ uint64_t s_published;                                 // phase 0 ends once every token's ORs landed
  __shared__ uint32_t s_tokens[kNumExperts];       // bit t: token t routes to local expert j
  __shared__ uint32_t s_routed[kNumExperts / 32];  // bit j: local expert j has routes

  const int t = blockIdx.x;  // the token; the cluster is the whole grid
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = threadIdx.x;  // this thread's expert
  // The bias does not depend on the previous kernel: load it before waiting.
  const float bias = p.bias[e];
  if (kMetadata) {
    if (t == 0) {
      s_tokens[e] = 0u;
      if (e < kNumExperts / 32) s_routed[e] = 0u;
      static_assert(kRouteMaxTokens == 8, "two slot words per expert");
      s_slot[e][0] = 0u;
      s_slot[e][1] = 0u;
      // Lane 0 of warp 0 inits the barrier, fences the init and arrives
      // expecting every CTA's bytes. ptxas issues the init on the uniform
      // datapath, once for the whole warp, which racecheck counts as a write
      // by each of its 32 lanes: the warp barrier orders those before lane
      // 0's arrival (without it racecheck warns). It is one WARPSYNC in warp
      // 0 of CTA 0, before griddepcontrol.wait.
      if (warp == 0 && gridDim.x > 1) {
        if (lane == 0) ptx::mbar_init(&s_published, 1);
        __syncwarp();
        if (lane == 0) {
          ptx::fence_mbarrier_init();
          ptx::mbar_arrive_expect_tx(&s_published, gridDim.x * kPublishBytes);
        }
      }
    }
    // "Started", and CTA 0's zeroed tables and initialised barrier visible to
    // the other CTAs' ORs: waited for before the first remote access. Every
    // thread of the CTA, all lanes of a warp together (.aligned).
    ptx::cluster_arrive_release();
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  // Steps 1-2 of the contract: torch.sigmoid's arithmetic (accurate expf, then 1 / y
  // correctly rounded, which __frcp_rn is), then one fp32 add.
  const float x = p.logits[t * p.logits_stride + e];
  const float s = __frcp_rn(__fadd_rn(1.0f, expf(-x)));
  s_score[e] = s;
  const uint64_t mine = candidate(__fadd_rn(s, bias), e);
  // 1: rank among the warp's 32 candidates. Lane m holds expert warp*32 + m,
  // so only the 32-bit key travels: a tie goes to the lower lane.
  const uint32_t key = static_cast<uint32_t>(mine >> 32);
  int rank = 0;
#pragma unroll
  for (int m = 0; m < 32; ++m) {
    const uint32_t other = __shfl_sync(kAll, key, m);
    rank += other > key || (other == key && m < lane);
  }
  if (rank < kTopK) s_final[warp * kTopK + rank] = mine;
  __syncthreads();
  // 2: rank among the 64 finalists; the first 8 are the slots (step 3).
  if (threadIdx.x < kFinalists) {
    const uint64_t c = s_final[threadIdx.x];
    int r = 0;
#pragma unroll 16
    for (int m = 0; m < kFinalists; ++m) r += s_final[m] > c;
    if (r < kTopK) s_slot_id[r] = expert_of(c);
  }
  __syncthreads();
  // 3: steps 4-5, and the ids into the metadata CTA's shared memory.
  if (kMetadata) ptx::cluster_wait();  // every CTA of the cluster has started (every thread, as the arrival)
  // Lane k < 8 of warp 0 holds slot k's id and weight.
  int id = 0;
  float weight = 0.0f;
  bool elsewhere = false;  // (metadata) slot k's expert is another rank's
  if (warp == 0) {
    // Every lane gathers the 8 scores (independent shuffles) and adds them
    // left to right.
    id = s_slot_id[lane % kTopK];
    const float score = s_score[id];
    float v[kTopK];
#pragma unroll
    for (int k = 0; k < kTopK; ++k) v[k] = __shfl_sync(kAll, score, k);
    float sum = v[0];
#pragma unroll
    for (int k = 1; k < kTopK; ++k) sum = __fadd_rn(sum, v[k]);
    weight = __fdiv_rn(__fmul_rn(score, p.route_scale), __fadd_rn(sum, kRouteDivisionEps));
    if (kMetadata && lane < kTopK) {
      // Publish this route in CTA 0's tables, so CTA 0 starts on them as soon
      // as its barrier says every token's ORs landed.
      const int j = id - p.local_expert_offset;
      elsewhere = j < 0 || j >= p.num_local_experts;
      if (gridDim.x == 1) {
        // One token, no cluster of two or more (red.async needs one): CTA 0's
        // own tables by shared atomics, ordered by the CTA barrier below.
        if (!elsewhere) {
          atomicOr(&s_slot[j][0], static_cast<uint32_t>(lane));
          atomicOr(&s_tokens[j], 1u);
          atomicOr(&s_routed[j / 32], 1u << (j % 32));
        }
      } else {
        const uint32_t bar = in_cta0(&s_published);
        if (!elsewhere) {
          ptx::red_async_or(in_cta0(&s_slot[j][t / 4]), static_cast<uint32_t>(lane) << (8 * (t % 4)), bar);
          ptx::red_async_or(in_cta0(&s_tokens[j]), 1u << t, bar);
          ptx::red_async_or(in_cta0(&s_routed[j / 32]), 1u << (j % 32), bar);
        } else {
          const uint32_t sink = in_cta0(&s_sink);
          for (int k = 0; k < 3; ++k) ptx::red_async_or(sink, 0u, bar);
        }
      }
    }
  }
  if (warp == 0 && lane < kTopK) {
    p.ids[t * kTopK + lane] = id;
    p.weights[t * kTopK + lane] = weight;
    if (kMetadata && elsewhere) p.metadata[kMetaExpandedToPermuted + t * kTopK + lane] = -1;
  }
  if constexpr (!kMetadata) return;

  // ---- metadata, in the cluster's first CTA: thread j owns local expert j ----
  if (t != 0) return;  // (its ORs need no wait: only CTA 0's shared memory is written, and CTA 0 waits)
  if (gridDim.x == 1)
    __syncthreads();
  else
    ptx::mbar_wait<true>(ptx::smem_addr(&s_published), 0);  // every token's ORs landed (phase 0)
  int32_t* const md = p.metadata;
  const int j = threadIdx.x;
  const int tile = p.tile_n;
  // count <= num_tokens <= 8 <= tile_n: an expert with routes has exactly one
  // CTA, and its CTA index is the number of routed local experts below it.
  static_assert(kRouteMaxTokens <= 8, "one CTA per local expert needs count <= the smallest tile_n (8)");
  int cta = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kNumExperts / 32; ++w) {
    const uint32_t bits = s_routed[w];
    total += __popc(bits);
    cta += w < j / 32 ? __popc(bits) : w == j / 32 ? __popc(bits & ((1u << (j % 32)) - 1u)) : 0;
  }
  if (j == 0) {
    md[kMetaNumCtas] = total;
    md[kMetaPaddedTokens] = total * tile;
  }
  const uint32_t tokens = j < p.num_local_experts ? s_tokens[j] : 0u;
  if (tokens != 0u) {
    // Thread j writes local expert j's CTA entry and its routes' permuted
    // indices (tokens ascending).
    md[kMetaCtaBatch + cta] = j;
    md[kMetaCtaLimit + cta] = cta * tile + __popc(tokens);  // = min((g + 1) * tile, ...) as count <= tile
    uint32_t rest = tokens;
#pragma unroll
    for (int n = 0; n < kRouteMaxTokens; ++n, rest &= rest - 1u) {
      if (rest == 0u) break;
      const int tok = __ffs(rest) - 1;
      const int slot = (s_slot[j][tok / 4] >> (8 * (tok % 4))) & 0xFF;
      md[kMetaExpandedToPermuted + tok * kTopK + slot] = cta * tile + n;
    }
  }
  // permuted_idx_to_token_idx for every row below total * tile, 16 bytes per
  // store: CTA g's first rows are the tokens of the g-th routed expert
  // (ascending; count <= 8 rows), written by that expert's thread; every
  // other row is -1, written by all threads together.
  int4* const rows = reinterpret_cast<int4*>(md + kMetaPermutedToToken);
  const int quads_log2 = __ffs(tile) - 3;  // log2(tile / 4); tile >= 8: the first 2 quads hold the tokens
  if (tokens != 0u) {
    uint32_t m = tokens;
    int out[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      out[q] = m ? __ffs(m) - 1 : -1;
      m &= m - 1u;
    }
    rows[(cta << quads_log2) + 0] = make_int4(out[0], out[1], out[2], out[3]);
    rows[(cta << quads_log2) + 1] = make_int4(out[4], out[5], out[6], out[7]);
  }
  const int quads = 1 << quads_log2;
  for (int v = j; v < (total << quads_log2); v += kThreads)
    if ((v & (quads - 1)) >= 2) rows[v] = make_int4(-1, -1, -1, -1);
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
