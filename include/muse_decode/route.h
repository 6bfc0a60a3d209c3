// route: Muse Spark MoE routing of 1..8 tokens, with the TRT-LLM-gen routing
// metadata of this rank's experts in the same launch (the contract:
// docs/contract.md).
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
// One call: route 1..8 tokens, with the metadata of this rank's experts when
// `metadata` is set.
struct RouteArgs {
  TensorRef logits;       // fp32 [b, 256], 1 <= b <= 8, unit column stride, rows 16-byte aligned
  TensorRef expert_bias;  // fp32 [256], contiguous, 16-byte aligned; decides the device
  double route_scale = kRouteScale;  // finite
  TensorRef ids;          // int32 [b, 8], contiguous: global expert ids
  TensorRef weights;      // fp32 [b, 8], contiguous
  std::optional<RoutingMetadata> metadata;  // absent: ids and weights only
  bool pdl = true;        // launch with programmatic dependent launch (see route())
};

// Why route does not take this call (the argument, the expected and the
// actual value), or nullopt when it does. The same text check_route throws.
std::optional<std::string> unsupported_route_call(const RouteArgs& args);

// Checks every argument (std::invalid_argument naming it, with the expected
// and the actual value); launches nothing and needs no GPU.
void check_route(const RouteArgs& args);

// check_route, then the launch on `stream`. Throws std::invalid_argument on
// bad arguments or a device prepare_route has not set up, std::runtime_error
// on a launch error. Allocates nothing, never synchronises; capturable in a
// CUDA graph. With pdl the kernel loads the bias before its
// griddepcontrol.wait and writes nothing before it, so it is correct whatever
// precedes it (and ~0.3 us faster in a chain, and cheaper to launch).
void route(const RouteArgs& args, Stream stream);

// One-time setup for CUDA device `device` (-1: the current one), outside graph
// capture, before the first route() on it. Throws std::invalid_argument on a
// GPU the kernels were not built for (or a device that is not there).
void prepare_route(int device = -1);

// The routing of one layer, bound to its bias and route scale. Construction
// validates the router (std::invalid_argument with the reason) and prepares
// the bias's device; a call checks its tensors, allocates nothing and is
// capturable in a CUDA graph.
class MuseRouting {
 public:
  explicit MuseRouting(const RouterDesc& router);

  // route() of these tensors with the bound bias and scale.
  void operator()(const TensorRef& logits, const TensorRef& ids, const TensorRef& weights,
                  const std::optional<RoutingMetadata>& metadata, Stream stream, bool pdl = true) const;

  const TensorRef& expert_bias() const { return bias_; }
  double route_scale() const { return route_scale_; }

 private:
  TensorRef bias_;
  double route_scale_;
};

}  // namespace muse_decode
