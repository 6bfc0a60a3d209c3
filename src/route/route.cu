// route kernel: one CTA of 8 warps routes up to 8 tokens (warp t: token t) and
// then, when asked, builds the TRT-LLM-gen metadata of this rank's experts.
//
// Latency is all that matters here (at most 8 KB of logits): one launch, no
// global atomics, three block barriers. The top 8 of a token's 256 keys come
// from one warp in three steps whose instruction count is what the critical
// path costs (one warp per token, no other work to hide it):
//  A. the 8 largest keys as a multiset, on 32-bit order-preserving integers:
//     a sorting network per lane (8 keys) then 5 butterfly merges of sorted
//     8-lists, each compare-exchange one max and one min (~250 instructions,
//     against ~750 for the same merges on 64-bit key+index words);
//  B. exact ties at the 8th key: the lowest experts among the equal keys are
//     selected (prefix counts across lanes);
//  C. the 8 selected (key, expert) pairs ordered by key, then expert.
#include <cuda_runtime.h>

#include <cstdint>

#include "muse_decode/route.h"

namespace muse_decode {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads / 32 == kRouteMaxTokens, "one warp per token");
static_assert(kThreads == kNumExperts, "metadata phase: one thread per local expert");
static_assert(kTopK == 8 && kNumExperts == 32 * 8, "each lane holds 8 of the 256 experts");
constexpr unsigned kAll = 0xFFFFFFFFu;

// Development aid: with MUSE_ROUTE_PROFILE defined, thread 0 records the SM
// clock and the global timer at each phase (scripts/dev/route_profile.cu).
#ifdef MUSE_ROUTE_PROFILE
__device__ long long g_route_stamps[2][16];
#define ROUTE_STAMP(i)                                                                  \
  do {                                                                                 \
    if (threadIdx.x == 0) {                                                            \
      long long t;                                                                     \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                          \
      g_route_stamps[0][i] = clock64();                                                \
      g_route_stamps[1][i] = t;                                                        \
    }                                                                                  \
  } while (0)
#else
#define ROUTE_STAMP(i) \
  do {                 \
  } while (0)
#endif

// The key as an unsigned integer of the same order: NaN above every number
// (as torch.topk ranks it), -0 equal to +0.
__device__ __forceinline__ uint32_t order_key(float key) {
  if (key != key) return 0xFFFFFFFFu;
  const uint32_t u = key == 0.0f ? 0u : __float_as_uint(key);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void cas_desc(uint32_t& a, uint32_t& b) {
  const uint32_t hi = max(a, b), lo = min(a, b);
  a = hi;
  b = lo;
}

// Sort 8 values in descending order (bitonic network, 24 compare-exchanges,
// all indices compile-time so the array stays in registers).
__device__ __forceinline__ void sort8_desc(uint32_t (&v)[8]) {
#pragma unroll
  for (int k = 2; k <= 8; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int l = i ^ j;
        if (l > i) {
          if ((i & k) == 0) cas_desc(v[i], v[l]);
          else cas_desc(v[l], v[i]);
        }
      }
    }
  }
}

// v descending; keep the 8 largest of v and the lane^mask partner's list.
__device__ __forceinline__ void merge_with_lane(uint32_t (&v)[8], int mask) {
  uint32_t other[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) other[i] = __shfl_xor_sync(kAll, v[i], mask);
  // max(v[i], other[7 - i]) is the top 8 of the union, as a bitonic sequence.
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = max(v[i], other[7 - i]);
#pragma unroll
  for (int j = 4; j > 0; j >>= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if ((i & j) == 0) cas_desc(v[i], v[i + j]);
  }
}

// Exclusive prefix sum over the lanes of the warp.
__device__ __forceinline__ int lane_prefix(int x, int lane) {
  int incl = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(kAll, incl, d);
    if (lane >= d) incl += up;
  }
  return incl - x;
}

// The general case of steps B and C: equal keys among the top 8 or at the
// 8th (exact ties, NaN). Of the keys equal to the 8th, the lowest experts are
// taken; then the winners are ordered by key, then expert. Expert order:
// first halves (i < 4) lane by lane, then second halves.
__device__ __forceinline__ void select_with_ties(const uint32_t (&key)[8], const uint32_t (&top)[8], int lane,
                                              uint64_t* pick, int* ids) {
  const uint32_t last = top[7];
  int above = 0;  // keys strictly above the 8th
#pragma unroll
  for (int k = 0; k < 7; ++k) above += top[k] > last;
  uint32_t eq_lo = 0, eq_hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    eq_lo |= static_cast<uint32_t>(key[i] == last) << i;
    eq_hi |= static_cast<uint32_t>(key[i + 4] == last) << i;
  }
  const int before_lo = lane_prefix(__popc(eq_lo), lane);
  const int total_lo = __shfl_sync(kAll, before_lo + __popc(eq_lo), 31);
  const int before_hi = total_lo + lane_prefix(__popc(eq_hi), lane);
  uint32_t selected = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t eq = i < 4 ? eq_lo : eq_hi;
    const int tie_rank = (i < 4 ? before_lo : before_hi) + __popc(eq & ((1u << (i & 3)) - 1u));
    if (key[i] > last || (key[i] == last && tie_rank < 8 - above)) selected |= 1u << i;
  }
  // Compact the 8 winners as (key, 255 - expert) words, then lane k < 8 finds
  // the slot of winner k by counting the winners that rank before it.
  const int slot0 = lane_prefix(__popc(selected), lane);
#pragma unroll
  for (int i = 0, n = 0; i < 8; ++i) {
    if (selected & (1u << i)) {
      const int e = (i < 4 ? 0 : 128) + lane * 4 + (i & 3);
      pick[slot0 + n++] = (static_cast<uint64_t>(key[i]) << 32) | static_cast<uint32_t>(kNumExperts - 1 - e);
    }
  }
  __syncwarp();
  if (lane < kTopK) {
    const uint64_t mine = pick[lane];
    int rank = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) rank += pick[k] > mine;
    ids[rank] = kNumExperts - 1 - static_cast<int>(mine & 0xFFFFFFFFu);
  }
}

__device__ __forceinline__ void wait_for_producer() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <bool kMetadata>
__global__ void __launch_bounds__(kThreads, 1) route_kernel(const RouteParams p) {
  __shared__ float s_score[kRouteMaxTokens][kNumExperts];
  __shared__ int s_ids[kRouteMaxTokens][kTopK];           // slot order
  __shared__ uint64_t s_pick[kRouteMaxTokens][kTopK];     // winners, expert order
  __shared__ uint32_t s_tokens[kNumExperts];          // bit t: token t routes to local expert j
  __shared__ uint32_t s_routed[kNumExperts / 32];      // bit j: local expert j has routes

  ROUTE_STAMP(9);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The bias does not depend on the previous kernel: load it before waiting.
  const float4 b0 = reinterpret_cast<const float4*>(p.bias)[lane];
  const float4 b1 = reinterpret_cast<const float4*>(p.bias)[32 + lane];
  if (kMetadata) {
    s_tokens[threadIdx.x] = 0u;
    if (threadIdx.x < kNumExperts / 32) s_routed[threadIdx.x] = 0u;
    __syncthreads();  // cleared before any warp ORs its tokens in
  }
  wait_for_producer();
  allow_dependents();
  ROUTE_STAMP(0);

  if (warp < p.num_tokens) {
    const float4* row = reinterpret_cast<const float4*>(p.logits + warp * p.logits_stride);
    const float4 x0 = row[lane], x1 = row[32 + lane];
    const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    ROUTE_STAMP(1);
    const float bias[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    uint32_t key[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = (i < 4 ? 0 : 128) + lane * 4 + (i & 3);
      // SPEC step 1 as torch.sigmoid on CUDA: accurate expf, then 1 / y
      // correctly rounded; __frcp_rn is that same IEEE result (1 / y rounded
      // to nearest) without the general division's subroutine call.
      const float s = __frcp_rn(__fadd_rn(1.0f, expf(-x[i])));
      s_score[warp][e] = s;
      key[i] = order_key(__fadd_rn(s, bias[i]));  // step 2: one fp32 add
    }
    // A: the 8 largest keys (with multiplicity), the same on every lane.
    uint32_t top[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) top[i] = key[i];
    sort8_desc(top);
    ROUTE_STAMP(2);
#pragma unroll
    for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(top, mask);
    const uint32_t last = top[7];
    ROUTE_STAMP(3);
    // Fast path, the usual case: the top 8 keys are distinct and no other
    // expert shares the 8th. An expert is then selected iff its key >= the 8th,
    // and its slot is the number of top keys above it: no cross-lane work.
    bool distinct = true;
    int n_last = 0;
#pragma unroll
    for (int k = 0; k < 7; ++k) distinct &= top[k] > top[k + 1];
#pragma unroll
    for (int i = 0; i < 8; ++i) n_last += key[i] == last;
    n_last = __reduce_add_sync(kAll, n_last);
    if (distinct && n_last == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (key[i] >= last) {
          int slot = 0;
#pragma unroll
          for (int k = 0; k < 8; ++k) slot += top[k] > key[i];
          s_ids[warp][slot] = (i < 4 ? 0 : 128) + lane * 4 + (i & 3);
        }
      }
    } else {
      select_with_ties(key, top, lane, s_pick[warp], s_ids[warp]);
    }
    ROUTE_STAMP(4);
    __syncwarp();
    // Every lane reads the 8 ids in slot order (step 3) and sums left to right.
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float score = s_score[warp][s_ids[warp][k]];
      sum = k == 0 ? score : __fadd_rn(sum, score);  // step 4: left to right
    }
    const float denom = __fadd_rn(sum, kRouteDivisionEps);
    ROUTE_STAMP(5);
    if (lane < kTopK) {
      const int id = s_ids[warp][lane];
      const float s = s_score[warp][id];
      p.ids[warp * kTopK + lane] = id;
      p.weights[warp * kTopK + lane] = __fdiv_rn(__fmul_rn(s, p.route_scale), denom);  // step 5
      if (kMetadata) {
        const int j = id - p.local_expert_offset;
        if (j >= 0 && j < p.num_local_experts) {
          atomicOr(&s_tokens[j], 1u << warp);
          atomicOr(&s_routed[j / 32], 1u << (j % 32));
        } else {
          p.metadata[kMetaExpandedToPermuted + warp * kTopK + lane] = -1;  // another rank's expert
        }
      }
    }
  }
  if constexpr (!kMetadata) return;

  // ---- metadata: thread j owns local expert j --------------------------------
  __syncthreads();
  ROUTE_STAMP(6);
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
  ROUTE_STAMP(7);
  int32_t* const md = p.metadata;
  if (j == 0) {
    md[kMetaNumCtas] = total;
    md[kMetaPaddedTokens] = total * tile;
  }
  const uint32_t tokens = j < p.num_local_experts ? s_tokens[j] : 0u;
  if (tokens != 0u) {
    // Thread j writes local expert j's CTA entry and its routes' permuted
    // indices (tokens ascending).
    const int count = __popc(tokens);
    md[kMetaCtaBatch + cta] = j;
    md[kMetaCtaLimit + cta] = cta * tile + count;  // = min((g + 1) * tile, ...) as count <= tile
    const int expert = j + p.local_expert_offset;
    uint32_t rest = tokens;
    for (int n = 0; rest != 0u; ++n, rest &= rest - 1u) {
      const int t = __ffs(rest) - 1;
      int k = 0;
#pragma unroll
      for (int q = 0; q < kTopK; ++q) k = s_ids[t][q] == expert ? q : k;
      md[kMetaExpandedToPermuted + t * kTopK + k] = cta * tile + n;
    }
  }
  // permuted_idx_to_token_idx for every row below total * tile, 16 bytes per
  // store, all threads together: CTA g's first rows are the tokens of the g-th
  // routed expert (ascending), the rest -1. (One thread writing its expert's
  // whole tile serialises 32-64 stores: 0.2 us slower at tile_n 128.)
  const int quads_log2 = __ffs(tile) - 3;  // log2(tile / 4)
  int4* const rows = reinterpret_cast<int4*>(md + kMetaPermutedToToken);
  for (int v = j; v < (total << quads_log2); v += kThreads) {
    const int g = v >> quads_log2;
    const int r0 = (v - (g << quads_log2)) * 4;
    int out[4] = {-1, -1, -1, -1};
    if (r0 < kRouteMaxTokens) {
      int w = 0, below = 0;  // the g-th set bit of the routed-expert bitmap
      while (below + __popc(s_routed[w]) <= g) below += __popc(s_routed[w++]);
      uint32_t bits = s_routed[w];
      for (int i = below; i < g; ++i) bits &= bits - 1u;
      uint32_t m = s_tokens[w * 32 + __ffs(bits) - 1];
      for (int i = 0; i < r0; ++i) m &= m - 1u;  // the tokens of earlier rows
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        out[q] = m ? __ffs(m) - 1 : -1;
        m &= m - 1u;
      }
    }
    rows[v] = make_int4(out[0], out[1], out[2], out[3]);
  }
  ROUTE_STAMP(8);
}

}  // namespace

int launch_route(const RouteParams& p, Stream stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(kThreads);
  config.stream = reinterpret_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = p.pdl ? 1 : 0;
  const cudaError_t err = p.metadata ? cudaLaunchKernelEx(&config, route_kernel<true>, p)
                                     : cudaLaunchKernelEx(&config, route_kernel<false>, p);
  return static_cast<int>(err);
}

}  // namespace muse_decode
