// route kernel: one CTA of 8 warps routes up to 8 tokens (warp t: token t) and
// then, when asked, builds the TRT-LLM-gen metadata of this rank's experts.
//
// Latency is all that matters here (at most 8 KB of logits): one launch, no
// global atomics, three block barriers. Top-8 of 256 is a per-lane sorting
// network over 8 candidates followed by 5 butterfly merges of sorted 8-lists
// (about 600 cycles), instead of 8 rounds of warp arg-max (about 1800).
#include <cuda_runtime.h>

#include <cstdint>

#include "muse_decode/route.h"

namespace muse_decode {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads / 32 == kRouteMaxTokens, "one warp per token");
static_assert(kThreads == kNumExperts, "metadata phase: one thread per local expert");
static_assert(kTopK == 8 && kNumExperts == 32 * 8, "each lane holds 8 of the 256 experts");

// A candidate packed so that a larger uint64 ranks first: the upper word is the
// key in an order-preserving integer form (NaN above everything), the lower
// word 255 - expert, so equal keys rank the lower expert first.
__device__ __forceinline__ uint64_t pack(float key, int expert) {
  uint32_t u = __float_as_uint(key);
  if (key == 0.0f) u = 0u;  // -0 and +0 are equal keys
  uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  if (key != key) ord = 0xFFFFFFFFu;  // NaN ranks above every number, as torch.topk
  return (static_cast<uint64_t>(ord) << 32) | static_cast<uint32_t>(kNumExperts - 1 - expert);
}
__device__ __forceinline__ int unpack_expert(uint64_t c) {
  return kNumExperts - 1 - static_cast<int>(c & 0xFFFFFFFFu);
}

// Compare-exchange so that a >= b afterwards.
__device__ __forceinline__ void cas_desc(uint64_t& a, uint64_t& b) {
  const uint64_t hi = a > b ? a : b, lo = a > b ? b : a;
  a = hi;
  b = lo;
}

// Sort 8 values in descending order (bitonic network, 24 compare-exchanges,
// all indices compile-time so the array stays in registers).
__device__ __forceinline__ void sort8_desc(uint64_t (&v)[8]) {
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
__device__ __forceinline__ void merge_with_lane(uint64_t (&v)[8], int mask) {
  uint64_t other[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) other[i] = __shfl_xor_sync(0xFFFFFFFFu, v[i], mask);
  // max(v[i], other[7 - i]) is the top 8 of the union, as a bitonic sequence.
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = v[i] > other[7 - i] ? v[i] : other[7 - i];
#pragma unroll
  for (int j = 4; j > 0; j >>= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if ((i & j) == 0) cas_desc(v[i], v[i + j]);
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
  __shared__ int s_ids[kRouteMaxTokens][kTopK];
  __shared__ uint32_t s_tokens[kNumExperts];     // bit t: token t routes to local expert j
  __shared__ int s_cta_off[kNumExperts];         // first CTA of local expert j
  __shared__ int s_cta_expert[kMaxRoutes];       // local expert of CTA g (at most one CTA per route)
  __shared__ int s_warp_sum[kThreads / 32];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The bias does not depend on the previous kernel: load it before waiting.
  const float4 b0 = reinterpret_cast<const float4*>(p.bias)[lane];
  const float4 b1 = reinterpret_cast<const float4*>(p.bias)[32 + lane];
  if (kMetadata) {
    s_tokens[threadIdx.x] = 0u;
    __syncthreads();  // cleared before any warp ORs its tokens in
  }
  wait_for_producer();
  allow_dependents();

  if (warp < p.num_tokens) {
    const float4* row = reinterpret_cast<const float4*>(p.logits + warp * p.logits_stride);
    const float4 x0 = row[lane], x1 = row[32 + lane];
    const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float bias[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    uint64_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = (i < 4 ? 0 : 128) + lane * 4 + (i & 3);
      // SPEC step 1: accurate expf and an IEEE division, as torch.sigmoid on CUDA.
      const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[i])));
      s_score[warp][e] = s;
      v[i] = pack(__fadd_rn(s, bias[i]), e);  // step 2: one fp32 add
    }
    sort8_desc(v);
#pragma unroll
    for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(v, mask);
    __syncwarp();
    // Every lane now holds the same top 8, best first (step 3).
    float score[8];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      score[k] = s_score[warp][unpack_expert(v[k])];
      sum = k == 0 ? score[0] : __fadd_rn(sum, score[k]);  // step 4: left to right
    }
    const float denom = __fadd_rn(sum, kRouteDivisionEps);
    if (lane < kTopK) {
      int id = 0;
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (lane == k) { id = unpack_expert(v[k]); s = score[k]; }
      p.ids[warp * kTopK + lane] = id;
      p.weights[warp * kTopK + lane] = __fdiv_rn(__fmul_rn(s, p.route_scale), denom);  // step 5
      if (kMetadata) {
        s_ids[warp][lane] = id;
        const int j = id - p.local_expert_offset;
        if (j >= 0 && j < p.num_local_experts) atomicOr(&s_tokens[j], 1u << warp);
      }
    }
  }
  if constexpr (!kMetadata) return;

  // ---- metadata: thread j owns local expert j --------------------------------
  __syncthreads();
  const int j = threadIdx.x;
  const int tile = p.tile_n;
  const uint32_t tokens = j < p.num_local_experts ? s_tokens[j] : 0u;
  const int count = __popc(tokens);
  const int ncta = (count + tile - 1) / tile;
  // Exclusive scan of ncta over experts (ascending): warp scan, then warp totals.
  int incl = ncta;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, incl, d);
    if (lane >= d) incl += up;
  }
  if (lane == 31) s_warp_sum[warp] = incl;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? s_warp_sum[w] : 0;
    total += s_warp_sum[w];
  }
  const int cta_off = before + incl - ncta;
  s_cta_off[j] = cta_off;
  int32_t* const md = p.metadata;
  for (int c = 0; c < ncta; ++c) {
    const int g = cta_off + c;
    s_cta_expert[g] = j;
    md[kMetaCtaBatch + g] = j;
    md[kMetaCtaLimit + g] = min((g + 1) * tile, cta_off * tile + count);
  }
  if (j == 0) {
    md[kMetaNumCtas] = total;
    md[kMetaPaddedTokens] = total * tile;
  }
  __syncthreads();
  // expanded_idx_to_permuted_idx: route r = t * 8 + k.
  const int routes = p.num_tokens * kTopK;
  if (j < routes) {
    const int t = j / kTopK;
    const int e = s_ids[t][j % kTopK] - p.local_expert_offset;
    int permuted = -1;
    if (e >= 0 && e < p.num_local_experts)
      permuted = s_cta_off[e] * tile + __popc(s_tokens[e] & ((1u << t) - 1u));
    md[kMetaExpandedToPermuted + j] = permuted;
  }
  // permuted_idx_to_token_idx for every row below total * tile (-1: padding).
  for (int r = j; r < total * tile; r += kThreads) {
    const int e = s_cta_expert[r / tile];
    const int within = r - s_cta_off[e] * tile;
    uint32_t rest = s_tokens[e];
    int token = -1;
    for (int n = 0; rest != 0u; ++n) {
      const int t = __ffs(rest) - 1;
      if (n == within) { token = t; break; }
      rest &= rest - 1u;
    }
    md[kMetaPermutedToToken + r] = token;
  }
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
