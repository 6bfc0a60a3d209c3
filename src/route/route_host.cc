// route host layer: the router check, the metadata layout, the per-call
// argument checks that guard the launch, the device setup and the launch.
#include <cmath>
#include <stdexcept>

#include "../common/checks.h"
#include "../common/hardware.h"
#include "muse_decode/route.h"
#include "params.h"

namespace muse_decode {

using detail::cat;
using detail::fail;
using detail::fail_expected;

bool valid_tile_n(int tile_n) {
  switch (tile_n) {
    case 8: case 16: case 32: case 64: case 128: case 256: return true;
    default: return false;
  }
}

static void require_tile_n(int tile_n, std::string_view name) {
  if (!valid_tile_n(tile_n)) fail_expected(name, "one of 8, 16, 32, 64, 128, 256", tile_n);
}

int64_t metadata_size(int tile_n) {
  require_tile_n(tile_n, "tile_n");
  return kMetaPermutedToToken + static_cast<int64_t>(kMaxRoutes) * tile_n + 1;
}

MetadataFields metadata_fields(int num_tokens, int tile_n) {
  require_tile_n(tile_n, "tile_n");
  if (num_tokens < 1 || num_tokens > kRouteMaxTokens)
    fail_expected("num_tokens", cat("in [1, ", kRouteMaxTokens, "]"), num_tokens);
  const int64_t routes = static_cast<int64_t>(num_tokens) * kTopK;
  return MetadataFields{{
      {"total_num_padded_tokens", kMetaPaddedTokens, 1},
      {"num_non_exiting_ctas", kMetaNumCtas, 1},
      {"expanded_idx_to_permuted_idx", kMetaExpandedToPermuted, routes},
      {"cta_idx_xy_to_batch_idx", kMetaCtaBatch, routes},
      {"cta_idx_xy_to_mn_limit", kMetaCtaLimit, routes},
      {"permuted_idx_to_token_idx", kMetaPermutedToToken, routes * tile_n + 1},
  }};
}

std::optional<std::string> unsupported_router(const RouterDesc& r) {
  if (r.score_normalization != "sigmoid")
    return cat(r.score_normalization, " router scores (the kernel computes sigmoid scores)");
  if (r.top_k != kTopK || r.num_experts != kNumExperts)
    return cat("top-", r.top_k, " of ", r.num_experts, " experts (the kernel routes top-", kTopK,
               " of ", kNumExperts, ")");
  if (r.output_multiplier)
    return cat("router output multiplier ", *r.output_multiplier,
               " still to apply (fold it into the router weight first)");
  if (static_cast<float>(r.division_eps) != kRouteDivisionEps)
    return cat("router_score_division_eps ", r.division_eps, " (the kernel divides by sum + 1e-15)");
  const TensorRef& b = r.expert_bias;
  if (!b.present() || b.data == nullptr)
    return std::string("a router without an expert bias (the kernel selects by score + an fp32 [256] bias)");
  if (b.dtype != DType::kFloat32)
    return cat("a ", dtype_name(b.dtype), " expert bias (the kernel reads float32)");
  if (b.ndim != 1 || b.shape[0] != kNumExperts)
    return cat("an expert bias of shape ", b.shape_str(), " (the kernel reads [", kNumExperts, "])");
  if (!b.contiguous()) return std::string("a non-contiguous expert bias");
  if (reinterpret_cast<uintptr_t>(b.data) % 16)
    return std::string("an expert bias not 16-byte aligned (the kernel reads 16 bytes at a time)");
  if (b.device < 0) return std::string("an expert bias in host memory");
  if (!std::isfinite(r.route_scale)) return cat("route_scale ", r.route_scale);
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Per-call checks.
route_impl::Params route_impl::params_of(const RouteArgs& a) {
  using namespace detail;
  // The bias (the layer's) decides the device.
  const TensorRef& bias = a.expert_bias;
  require_present(bias, "expert_bias");
  require_dtype(bias, "expert_bias", DType::kFloat32);
  require_cuda(bias, "expert_bias");
  if (bias.ndim != 1 || bias.shape[0] != kNumExperts || !bias.contiguous())
    fail_expected("expert_bias", cat("a contiguous [", kNumExperts, "]"),
                  cat(bias.shape_str(), bias.contiguous() ? "" : " non-contiguous"));
  require_aligned(bias.data, "expert_bias", 16);
  const int device = bias.device;
  if (!std::isfinite(a.route_scale)) fail_expected("route_scale", "finite", a.route_scale);

  const TensorRef& logits = a.logits;
  require_present(logits, "logits");
  require_dtype(logits, "logits", DType::kFloat32);
  require_cuda(logits, "logits");
  require_same_device(logits, "logits", device);
  if (logits.ndim != 2 || logits.shape[0] < 1 || logits.shape[0] > kRouteMaxTokens ||
      logits.shape[1] != kNumExperts)
    fail_expected("logits", cat("[b, ", kNumExperts, "] with 1 <= b <= ", kRouteMaxTokens),
                  logits.shape_str());
  if (logits.stride[1] != 1) fail_expected("logits", "unit stride along experts", cat("stride ", logits.stride[1]));
  require_aligned(logits.data, "logits", 16);
  if (logits.shape[0] > 1 && (logits.stride[0] % 4 != 0 || logits.stride[0] < kNumExperts))
    fail_expected("logits rows", "16-byte aligned (row stride a multiple of 4 elements, at least 256)",
                  cat("row stride ", logits.stride[0]));
  const int b = static_cast<int>(logits.shape[0]);

  const auto require_out = [&](const TensorRef& t, const char* name, DType dtype) {
    require_present(t, name);
    require_dtype(t, name, dtype);
    require_cuda(t, name);
    require_same_device(t, name, device);
    if (t.ndim != 2 || t.shape[0] != b || t.shape[1] != kTopK || !t.contiguous())
      fail_expected(name, cat("a contiguous [", b, ", ", kTopK, "] tensor (b = the logits' rows)"),
                    cat(t.shape_str(), t.contiguous() ? "" : " non-contiguous"));
  };
  require_out(a.ids, "ids", DType::kInt32);
  require_out(a.weights, "weights", DType::kFloat32);
  require_disjoint(a.ids, "ids", a.weights, "weights");
  require_disjoint(a.ids, "ids", logits, "logits");
  require_disjoint(a.weights, "weights", logits, "logits");
  require_disjoint(a.ids, "ids", bias, "expert_bias");
  require_disjoint(a.weights, "weights", bias, "expert_bias");

  Params p;
  p.logits = static_cast<const float*>(logits.data);
  p.logits_stride = logits.shape[0] > 1 ? logits.stride[0] : kNumExperts;
  p.bias = static_cast<const float*>(bias.data);
  p.ids = static_cast<int32_t*>(a.ids.data);
  p.weights = static_cast<float*>(a.weights.data);
  p.num_tokens = b;
  p.route_scale = static_cast<float>(a.route_scale);
  p.pdl = a.pdl;
  if (a.metadata) {
    const RoutingMetadata& m = *a.metadata;
    require_tile_n(m.tile_n, "metadata.tile_n");
    if (m.local_expert_offset < 0 || m.local_expert_offset >= kNumExperts)
      fail_expected("metadata.local_expert_offset", cat("in [0, ", kNumExperts, ")"), m.local_expert_offset);
    if (m.num_local_experts < 1 || m.local_expert_offset + m.num_local_experts > kNumExperts)
      fail_expected("metadata.num_local_experts",
                    cat("in [1, ", kNumExperts - m.local_expert_offset, "] (offset ", m.local_expert_offset,
                        " + count within ", kNumExperts, " experts)"),
                    m.num_local_experts);
    const TensorRef& buf = m.buffer;
    require_present(buf, "metadata.buffer");
    require_dtype(buf, "metadata.buffer", DType::kInt32);
    require_cuda(buf, "metadata.buffer");
    require_same_device(buf, "metadata.buffer", device);
    if (buf.ndim != 1 || !buf.contiguous())
      fail_expected("metadata.buffer", "a contiguous 1-D tensor", buf.shape_str());
    const int64_t need = metadata_size(m.tile_n);
    if (buf.shape[0] < need)
      fail_expected("metadata.buffer", cat("at least ", need, " int32 elements for tile_n ", m.tile_n),
                    buf.shape[0]);
    require_aligned(buf.data, "metadata.buffer", 16);
    require_disjoint(buf, "metadata.buffer", a.ids, "ids");
    require_disjoint(buf, "metadata.buffer", a.weights, "weights");
    require_disjoint(buf, "metadata.buffer", logits, "logits");
    require_disjoint(buf, "metadata.buffer", bias, "expert_bias");
    p.metadata = static_cast<int32_t*>(buf.data);
    p.local_expert_offset = m.local_expert_offset;
    p.num_local_experts = m.num_local_experts;
    p.tile_n = m.tile_n;
  }
  return p;
}

void check_route(const RouteArgs& args) { route_impl::params_of(args); }

std::optional<std::string> unsupported_route_call(const RouteArgs& args) {
  return detail::reason_of([&] { check_route(args); });
}

// ---------------------------------------------------------------------------
// Launch. The kernel needs no attributes: preparing a device is refusing the
// GPUs it was not built for, once, outside the per-call path.
namespace {
struct RouteDevice {};
detail::PerDevice<RouteDevice> g_prepared;
}  // namespace

void prepare_route(int device) {
  detail::prepare_device(g_prepared, "route", device, [](int) { return RouteDevice{}; });
}

void route(const RouteArgs& args, Stream stream) {
  const route_impl::Params p = route_impl::params_of(args);
  detail::require_prepared(g_prepared, "route", args.expert_bias.device);
  detail::throw_if_cuda_error(route_impl::launch(p, stream), "route: kernel launch");
}

// ---------------------------------------------------------------------------
MuseRouting::MuseRouting(const RouterDesc& router) {
  if (auto why = unsupported_router(router)) fail("MuseRouting does not support " + *why);
  bias_ = router.expert_bias;
  route_scale_ = router.route_scale;
  prepare_route(bias_.device);
}

void MuseRouting::operator()(const TensorRef& logits, const TensorRef& ids, const TensorRef& weights,
                             const std::optional<RoutingMetadata>& metadata, Stream stream, bool pdl) const {
  RouteArgs a;
  a.logits = logits;
  a.expert_bias = bias_;
  a.route_scale = route_scale_;
  a.ids = ids;
  a.weights = weights;
  a.metadata = metadata;
  a.pdl = pdl;
  route(a, stream);
}

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the launch with
// cudaErrorNotSupported.
namespace muse_decode::route_impl {
int launch(const Params&, Stream) { return detail::kCudaErrorNotSupported; }
}  // namespace muse_decode::route_impl
#endif
