// route: Muse Spark MoE routing of 1..8 tokens, with the TRT-LLM-gen routing
// metadata of this rank's experts in the same launch (SPEC section 4).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {

// ---------------------------------------------------------------------------
// Metadata layout: int32 offsets into one buffer, each field 16-byte aligned.
// Extents are those of num_tokens = 8 (64 routes); a call with fewer tokens
// uses a prefix of each field at the same offsets.
inline constexpr int kMaxRoutes = kRouteMaxTokens * kTopK;      // 64
inline constexpr int kMetaPaddedTokens = 0;                     // [1]
inline constexpr int kMetaNumCtas = 4;                          // [1]
inline constexpr int kMetaExpandedToPermuted = 8;               // [R]
inline constexpr int kMetaCtaBatch = kMetaExpandedToPermuted + kMaxRoutes;   // [R]
inline constexpr int kMetaCtaLimit = kMetaCtaBatch + kMaxRoutes;             // [R]
inline constexpr int kMetaPermutedToToken = kMetaCtaLimit + kMaxRoutes;      // [R*tile_n + 1]
static_assert(kMetaPermutedToToken % 4 == 0, "every field starts on 16 bytes");

bool valid_tile_n(int tile_n);  // 8, 16, 32, 64, 128 or 256
// int32 elements of a metadata buffer for tile_n (num_tokens = 8): the last
// field ends with a guard element that is never written. Throws on a bad tile_n.
int64_t metadata_size(int tile_n);

// One field of the metadata: int32 offset into the buffer and its length.
struct MetadataField {
  const char* name;
  int64_t offset;
  int64_t length;
};
// The six fields for num_tokens tokens (1..8), in the order
// total_num_padded_tokens, num_non_exiting_ctas, expanded_idx_to_permuted_idx,
// cta_idx_xy_to_batch_idx, cta_idx_xy_to_mn_limit, permuted_idx_to_token_idx.
struct MetadataFields {
  MetadataField field[6];
};
MetadataFields metadata_fields(int num_tokens, int tile_n);

// Where a call writes the metadata of local experts [local_expert_offset,
// local_expert_offset + num_local_experts) for GEMM tile tile_n.
struct RoutingMetadata {
  TensorRef buffer;           // int32, contiguous, >= metadata_size(tile_n) elements
  int local_expert_offset = 0;
  int num_local_experts = kNumExperts;
  int tile_n = 128;
};

// ---------------------------------------------------------------------------
// The router a MuseRouting is built from (the attributes vLLM's layer carries).
struct RouterDesc {
  std::string score_normalization = "sigmoid";
  int top_k = kTopK;
  int num_experts = kNumExperts;
  // Multiplier still to be applied to the router output; absent once folded.
  std::optional<double> output_multiplier;
  double division_eps = 1e-15;
  TensorRef expert_bias;      // fp32 [256], contiguous, 16-byte aligned
  double route_scale = 1.0;
};

// Why route cannot reproduce this router, or nullopt when it can.
std::optional<std::string> unsupported_router(const RouterDesc& router);

// ---------------------------------------------------------------------------
// Launch parameters of the kernel (device layer; the host checks fill them).
struct RouteParams {
  const float* logits = nullptr;   // [num_tokens, 256] fp32; rows 16-byte aligned
  int64_t logits_stride = 256;     // elements between rows, multiple of 4
  const float* bias = nullptr;     // [256] fp32, 16-byte aligned
  int32_t* ids = nullptr;          // [num_tokens, 8] global expert ids, contiguous
  float* weights = nullptr;        // [num_tokens, 8] fp32, contiguous
  int num_tokens = 0;              // 1..8
  float route_scale = 1.0f;
  int32_t* metadata = nullptr;     // may be null: no metadata
  int local_expert_offset = 0;
  int num_local_experts = 0;
  int tile_n = 0;
  bool pdl = false;                // launch with programmatic dependent launch
};

// Enqueue the kernel; no checks (callers use MuseRouting). Returns the launch error.
int launch_route(const RouteParams& params, Stream stream);  // cudaError_t as int

// The routing of one layer, bound to its bias and route scale. Construction
// validates the router (throws std::invalid_argument with the reason); a call
// checks its tensors, allocates nothing and is capturable in a CUDA graph.
class MuseRouting {
 public:
  explicit MuseRouting(const RouterDesc& router);

  // Checks every argument (std::invalid_argument naming it) and returns the
  // kernel parameters; launches nothing.
  RouteParams check(const TensorRef& logits, const TensorRef& ids, const TensorRef& weights,
                    const RoutingMetadata* metadata) const;
  // check() then launch on `stream`; throws std::runtime_error on a launch
  // error. With pdl the kernel is launched with programmatic dependent launch:
  // it loads the bias before waiting for the previous kernel and writes
  // nothing before, so it is correct whatever precedes it (and ~0.3 us
  // faster in a chain, and cheaper to launch on the host).
  void operator()(const TensorRef& logits, const TensorRef& ids, const TensorRef& weights,
                  const RoutingMetadata* metadata, Stream stream, bool pdl = true) const;

  const float* bias() const { return bias_; }
  float route_scale() const { return route_scale_; }

 private:
  const float* bias_;
  int bias_device_;
  float route_scale_;
};

}  // namespace muse_decode
