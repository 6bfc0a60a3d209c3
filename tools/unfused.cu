#include "unfused.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>

#include "muse_decode/constants.h"
#include "muse_decode/route.h"

namespace muse_decode::tool {
namespace {

__global__ void norm_rope_kernel(__nv_bfloat16* y, int n, int heads_qk, const int64_t* positions,
                                 const float* cos_sin) {
  const int t = blockIdx.x / heads_qk, h = blockIdx.x % heads_qk, d = threadIdx.x;  // 64 threads
  __nv_bfloat16* row = y + static_cast<int64_t>(t) * n + h * kHeadDim;
  __shared__ float v[kHeadDim];
  __shared__ float ms;
  v[d] = __bfloat162float(row[d]);
  __syncthreads();
  if (d == 0) {
    float s = 0.0f;
    for (int i = 0; i < kHeadDim; ++i) s += v[i] * v[i];
    ms = s / kHeadDim;
  }
  __syncthreads();
  float a = v[d] * rsqrtf(ms + kRmsNormEps);
  if (cos_sin) {
    const int j = d / 2;
    const float c = cos_sin[positions[t] * 64 + j], s = cos_sin[positions[t] * 64 + 32 + j];
    const float x0 = v[2 * j] * rsqrtf(ms + kRmsNormEps), x1 = v[2 * j + 1] * rsqrtf(ms + kRmsNormEps);
    a = (d % 2 == 0) ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  row[d] = __float2bfloat16(a);
}

__global__ void insert_kernel(const __nv_bfloat16* y, int n, int heads, int kvh, const int64_t* slots,
                              __nv_bfloat16* cache) {
  const int t = blockIdx.x / kvh, kv = blockIdx.x % kvh, d = threadIdx.x;  // 128 threads
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int col = d < kHeadDim ? (heads + kv) * kHeadDim + d : (heads + kvh + kv) * kHeadDim + d - kHeadDim;
  cache[((slot / kPageSize * kvh + kv) * kPageSize + slot % kPageSize) * 128 + d] = y[static_cast<int64_t>(t) * n + col];
}

// One block of 128 threads per (row, head): online softmax over the visible
// keys, thread-strided, then a block reduction of (max, sum, 64 accumulators).
__global__ void attention_kernel(UnfusedAttentionArgs a) {
  const int heads = kHeadsPerKvHead * a.num_kv_heads;
  const int row = blockIdx.x / heads, h = blockIdx.x % heads, kv = h / kHeadsPerKvHead;
  const int r = row / kVerifyLen, i = row % kVerifyLen;
  const int L = a.seq_lens[r], p = L - kVerifyLen + i;
  const int lo = a.window ? max(0, p - a.window + 1) : 0;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + row * a.q_stride + h * kHeadDim;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.kv_cache);
  float qf[kHeadDim];
  for (int d = 0; d < kHeadDim; ++d) qf[d] = __bfloat162float(q[d]);
  float m = -INFINITY, l = 0.0f, acc[kHeadDim] = {};
  for (int j = lo + threadIdx.x; j <= p; j += blockDim.x) {
    const int page = a.block_table[r * a.table_stride + j / kPageSize];
    const __nv_bfloat16* kvrow = cache + ((static_cast<int64_t>(page) * a.num_kv_heads + kv) * kPageSize + j % kPageSize) * 128;
    float s = 0.0f;
    for (int d = 0; d < kHeadDim; ++d) s += qf[d] * __bfloat162float(kvrow[d]);
    s *= kSoftmaxScale;
    const float mn = fmaxf(m, s), scale = expf(m - mn), w = expf(s - mn);
    l = l * scale + w;
    for (int d = 0; d < kHeadDim; ++d) acc[d] = acc[d] * scale + w * __bfloat162float(kvrow[kHeadDim + d]);
    m = mn;
  }
  __shared__ float sm[128], sl[128], sacc[128][kHeadDim + 1];
  sm[threadIdx.x] = m;
  sl[threadIdx.x] = l;
  for (int d = 0; d < kHeadDim; ++d) sacc[threadIdx.x][d] = acc[d];
  __syncthreads();
  if (threadIdx.x < kHeadDim) {
    const int d = threadIdx.x;
    float mx = -INFINITY;
    for (int k = 0; k < blockDim.x; ++k) mx = fmaxf(mx, sm[k]);
    float total = 0.0f, o = 0.0f;
    for (int k = 0; k < blockDim.x; ++k) {
      if (sm[k] == -INFINITY) continue;
      const float f = expf(sm[k] - mx);
      total += sl[k] * f;
      o += sacc[k][d] * f;
    }
    a.scratch[row * heads * kHeadDim + h * kHeadDim + d] = o / total;
  }
}

__global__ void norm_gate_kernel(UnfusedAttentionArgs a) {
  const int heads = kHeadsPerKvHead * a.num_kv_heads;
  const int row = blockIdx.x / heads, h = blockIdx.x % heads, d = threadIdx.x;  // 64 threads
  const float o = a.scratch[row * heads * kHeadDim + h * kHeadDim + d];
  __shared__ float sq[kHeadDim];
  sq[d] = o * o;
  __syncthreads();
  float ms = 0.0f;
  for (int k = 0; k < kHeadDim; ++k) ms += sq[k];
  ms /= kHeadDim;
  const float g = __bfloat162float(static_cast<const __nv_bfloat16*>(a.gate)[row * a.gate_stride + h * kHeadDim + d]);
  static_cast<__nv_bfloat16*>(a.out)[row * heads * kHeadDim + h * kHeadDim + d] =
      __float2bfloat16(o * rsqrtf(ms + kRmsNormEps) / (1.0f + expf(-g)));
}

// One block of 256 threads per token: 8 rounds of block arg-max.
__global__ void route_kernel(UnfusedRouteArgs a) {
  const int t = blockIdx.x, e = threadIdx.x;
  __shared__ float s[kNumExperts], key[kNumExperts];
  __shared__ bool used[kNumExperts];
  __shared__ float picked[kTopK];
  s[e] = 1.0f / (1.0f + expf(-a.logits[t * kNumExperts + e]));
  key[e] = s[e] + a.bias[e];
  used[e] = false;
  __syncthreads();
  if (e == 0) {  // plain: one thread scans for each slot (NaN first, then larger, then lower index)
    for (int k = 0; k < kTopK; ++k) {
      int b = -1;
      for (int i = 0; i < kNumExperts; ++i) {
        if (used[i]) continue;
        const bool vn = key[i] != key[i], bn = b >= 0 && key[b] != key[b];
        if (b < 0 || (vn && !bn) || (!vn && !bn && key[i] > key[b])) b = i;
      }
      used[b] = true;
      a.ids[t * kTopK + k] = b;
      picked[k] = s[b];
    }
  }
  __syncthreads();
  if (e < kTopK) {
    float sum = 0.0f;
    for (int k = 0; k < kTopK; ++k) sum += picked[k];
    a.weights[t * kTopK + e] = picked[e] / (sum + kRouteDivisionEps);
  }
}

__global__ void metadata_kernel(UnfusedRouteArgs a) {  // one thread: the plain serial build
  const int routes = a.tokens * kTopK, tile = a.tile_n;
  int32_t* md = a.metadata;
  __shared__ int count[kNumExperts], first[kNumExperts], seen[kNumExperts];
  for (int j = 0; j < kNumExperts; ++j) count[j] = seen[j] = 0;
  for (int r = 0; r < routes; ++r) {
    const int j = a.ids[r] - a.local_expert_offset;
    if (j >= 0 && j < a.num_local_experts) ++count[j];
  }
  int ctas = 0;
  for (int j = 0; j < a.num_local_experts; ++j) {
    first[j] = ctas;
    const int n = (count[j] + tile - 1) / tile;
    for (int c = 0; c < n; ++c) {
      md[kMetaCtaBatch + ctas + c] = j;
      md[kMetaCtaLimit + ctas + c] = min((ctas + c + 1) * tile, first[j] * tile + count[j]);
    }
    ctas += n;
  }
  md[kMetaNumCtas] = ctas;
  md[kMetaPaddedTokens] = ctas * tile;
  for (int p = 0; p < ctas * tile; ++p) md[kMetaPermutedToToken + p] = -1;
  for (int r = 0; r < routes; ++r) {
    const int j = a.ids[r] - a.local_expert_offset;
    if (j < 0 || j >= a.num_local_experts) {
      md[kMetaExpandedToPermuted + r] = -1;
      continue;
    }
    const int p = first[j] * tile + seen[j]++;
    md[kMetaExpandedToPermuted + r] = p;
    md[kMetaPermutedToToken + p] = r / kTopK;
  }
}

}  // namespace

void unfused_front(const UnfusedFrontArgs& a, void* handle, cudaStream_t stream) {
  const int n = qkv_width(a.num_kv_heads), heads = kHeadsPerKvHead * a.num_kv_heads;
  cublasHandle_t h = static_cast<cublasHandle_t>(handle);
  cublasSetStream(h, stream);
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: out^T [N, T] = W [N, 8192] (row-major = col-major W^T) x x^T.
  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, a.tokens, kHiddenSize, &one, a.weight, CUDA_R_16BF, kHiddenSize,
               a.x, CUDA_R_16BF, kHiddenSize, &zero, a.out, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  norm_rope_kernel<<<a.tokens * (heads + a.num_kv_heads), kHeadDim, 0, stream>>>(
      static_cast<__nv_bfloat16*>(a.out), n, heads + a.num_kv_heads, a.positions, a.cos_sin);
  insert_kernel<<<a.tokens * a.num_kv_heads, 128, 0, stream>>>(static_cast<const __nv_bfloat16*>(a.out), n, heads,
                                                               a.num_kv_heads, a.slots,
                                                               static_cast<__nv_bfloat16*>(a.kv_cache));
}

void unfused_o_proj(const UnfusedOProjArgs& a, void* cublas_handle, cudaStream_t stream) {
  auto h = static_cast<cublasHandle_t>(cublas_handle);
  cublasSetStream(h, stream);
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: out^T [8192, T] = W [8192, K] (row-major = col-major W^T) x x^T.
  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kHiddenSize, a.tokens, a.in_width, &one, a.weight, CUDA_R_16BF,
               a.in_width, a.x, CUDA_R_16BF, a.in_width, &zero, a.out, CUDA_R_16BF, kHiddenSize, CUBLAS_COMPUTE_32F,
               CUBLAS_GEMM_DEFAULT);
}

void unfused_attention(const UnfusedAttentionArgs& a, cudaStream_t stream) {
  const int blocks = a.reqs * kVerifyLen * kHeadsPerKvHead * a.num_kv_heads;
  attention_kernel<<<blocks, 128, 0, stream>>>(a);
  norm_gate_kernel<<<blocks, kHeadDim, 0, stream>>>(a);
}

void unfused_route(const UnfusedRouteArgs& a, cudaStream_t stream) {
  route_kernel<<<a.tokens, kNumExperts, 0, stream>>>(a);
  if (a.metadata) metadata_kernel<<<1, 1, 0, stream>>>(a);
}

}  // namespace muse_decode::tool
