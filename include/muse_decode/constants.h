// Muse Spark 1.x model constants that the kernels hard-wire.
//
// Sources (see shared/reference/muse-spark-facts.md): NeMo AutoModel
// MuseSpark1xOmniConfig and the JAX reference musespark/config.py for the
// shapes; the Muse-Spark-Open-DSpark model card for the verify width.
#pragma once

#include <cstdint>

namespace muse_decode {

// --- attention ------------------------------------------------------------
inline constexpr int kHiddenSize = 8192;        // config hidden_size
inline constexpr int kNumHeads = 128;           // config num_attention_heads (TP1)
inline constexpr int kNumKvHeads = 16;          // config num_key_value_heads (TP1)
inline constexpr int kHeadDim = 64;             // config head_dim
inline constexpr int kHeadsPerKvHead = 8;       // 128 / 16 (GQA group)
inline constexpr int kNumLayers = 62;           // full attention where layer % 4 == 1
inline constexpr int kSlidingWindow = 2048;     // keys, the query's own key included
inline constexpr double kRopeTheta = 500000.0;  // sliding layers only, interleaved pairs
// softmax scale = head_dim^-0.5 * qk_scale_factor (5.4730064863875).
inline constexpr double kQkScaleFactor = 5.4730064863875;
inline constexpr float kSoftmaxScale = 0.6841258107984375f;
inline constexpr float kRmsNormEps = 1e-5f;     // q/k norm and o-norm (weightless)

// --- speculative decode ---------------------------------------------------
inline constexpr int kDraftTokens = 7;          // DSpark proposes 7
inline constexpr int kVerifyLen = 8;            // 1 + 7 query rows per request

// --- paged KV cache -------------------------------------------------------
inline constexpr int kPageSize = 16;            // keys per page
inline constexpr int kCacheRowWidth = 2 * kHeadDim;  // K in 0:64, V in 64:128

// --- MoE routing ----------------------------------------------------------
inline constexpr int kNumExperts = 256;         // routed experts, no shared expert
inline constexpr int kTopK = 8;
inline constexpr int kRouteMaxTokens = 8;       // route serves 1..8 tokens
inline constexpr float kRouteDivisionEps = 1e-15f;  // weight = s / (sum + eps)
// Router output multiplier 2^-2.5, folded into the fp32 router weight at load.
inline constexpr double kRouterOutputMultiplier = 0.17677669529663687;
inline constexpr double kRouteScale = 1.0;      // routed_scaling_factor

// --- attention front ------------------------------------------------------
inline constexpr int kFrontMaxTokens = 16;      // qkv_front serves 1..16 tokens

// Output width of the fused [q | k | v | gate] projection for num_kv_heads.
constexpr int qkv_width(int num_kv_heads) {
  return 2 * (kHeadsPerKvHead + 1) * num_kv_heads * kHeadDim;
}
static_assert(qkv_width(2) == 2304, "TP8 rank: 16 query heads, 2 KV heads");
static_assert(qkv_width(16) == 18432, "TP1: 128 query heads, 16 KV heads");

}  // namespace muse_decode
