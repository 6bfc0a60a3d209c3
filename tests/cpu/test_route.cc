// CPU tests of route's host layer and reference: the metadata layout, every
// refusal reason (exact text, the same from unsupported_route_call and
// check_route), the op refusing a device not prepared, the reference against
// double-precision formulas, ties, NaN, and the metadata builder for every
// tile_n and several rank splits.
#include <gtest/gtest.h>

#include "check_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"
#include "route/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

constexpr int kTiles[] = {8, 16, 32, 64, 128, 256};

using muse_decode::testing::addr;
using muse_decode::testing::error_of;
using muse_decode::testing::kUnpreparedDevice;
using muse_decode::testing::prepare_refusal;

md::RouterDesc good_router() {
  md::RouterDesc r;
  r.expert_bias = md::make_tensor(addr(0x10000), DType::kFloat32, {256});
  return r;
}

struct Call {
  TensorRef logits = md::make_tensor(addr(0x20000), DType::kFloat32, {4, 256});
  TensorRef bias = md::make_tensor(addr(0x10000), DType::kFloat32, {256});
  double route_scale = 1.0;
  TensorRef ids = md::make_tensor(addr(0x30000), DType::kInt32, {4, 8});
  TensorRef weights = md::make_tensor(addr(0x40000), DType::kFloat32, {4, 8});
  md::RoutingMetadata meta{md::make_tensor(addr(0x50000), DType::kInt32, {md::metadata_size(64)}), 32, 64, 64};

  md::RouteArgs args(bool with_meta = true) const {
    md::RouteArgs a;
    a.logits = logits;
    a.expert_bias = bias;
    a.route_scale = route_scale;
    a.ids = ids;
    a.weights = weights;
    if (with_meta) a.metadata = meta;
    return a;
  }
};

// The text check_route throws, after checking that unsupported_route_call
// returns the same.
std::string check(const Call& c, bool with_meta = true) {
  const md::RouteArgs a = c.args(with_meta);
  const std::string thrown = error_of([&] { md::check_route(a); });
  EXPECT_EQ(md::unsupported_route_call(a).value_or("(no error)"), thrown);
  return thrown;
}

}  // namespace

TEST(RouteLayout, MetadataSizeAndFields) {
  for (int tile : kTiles) {
    EXPECT_EQ(md::metadata_size(tile), 200 + 64 * tile + 1);
    for (int t = 1; t <= 8; ++t) {
      const auto f = md::metadata_fields(t, tile);
      const char* names[] = {"total_num_padded_tokens", "num_non_exiting_ctas",
                             "expanded_idx_to_permuted_idx", "cta_idx_xy_to_batch_idx",
                             "cta_idx_xy_to_mn_limit", "permuted_idx_to_token_idx"};
      const int64_t lengths[] = {1, 1, 8 * t, 8 * t, 8 * t, 8 * t * tile + 1};
      int64_t end = 0;
      for (int i = 0; i < 6; ++i) {
        EXPECT_STREQ(f.field[i].name, names[i]);
        EXPECT_EQ(f.field[i].length, lengths[i]);
        EXPECT_EQ(f.field[i].offset % 4, 0) << names[i] << " must start on 16 bytes";
        EXPECT_GE(f.field[i].offset, end) << names[i] << " overlaps the previous field";
        end = f.field[i].offset + f.field[i].length;
      }
      EXPECT_LE(end, md::metadata_size(tile));
      if (t == 8) {
        EXPECT_EQ(end, md::metadata_size(tile));
      }
    }
  }
  EXPECT_EQ(error_of([] { md::metadata_size(12); }),
            "tile_n must be one of 8, 16, 32, 64, 128, 256, got 12");
  EXPECT_EQ(error_of([] { md::metadata_fields(9, 8); }), "num_tokens must be in [1, 8], got 9");
  EXPECT_EQ(error_of([] { md::metadata_fields(0, 8); }), "num_tokens must be in [1, 8], got 0");
}

TEST(RouteChecks, UnsupportedRouterReasons) {
  EXPECT_FALSE(md::unsupported_router(good_router()).has_value());
  auto r = good_router();
  r.score_normalization = "softmax";
  EXPECT_EQ(*md::unsupported_router(r), "softmax router scores (the kernel computes sigmoid scores)");
  r = good_router();
  r.top_k = 4;
  EXPECT_EQ(*md::unsupported_router(r), "top-4 of 256 experts (the kernel routes top-8 of 256)");
  r = good_router();
  r.num_experts = 128;
  EXPECT_EQ(*md::unsupported_router(r), "top-8 of 128 experts (the kernel routes top-8 of 256)");
  r = good_router();
  r.output_multiplier = 0.25;
  EXPECT_EQ(*md::unsupported_router(r),
            "router output multiplier 0.25 still to apply (fold it into the router weight first)");
  r = good_router();
  r.division_eps = 1e-6;
  EXPECT_EQ(*md::unsupported_router(r), "router_score_division_eps 1e-06 (the kernel divides by sum + 1e-15)");
  r = good_router();
  r.expert_bias.dtype = DType::kBFloat16;
  EXPECT_EQ(*md::unsupported_router(r), "a bfloat16 expert bias (the kernel reads float32)");
  r = good_router();
  r.expert_bias = md::make_tensor(addr(0x10000), DType::kFloat32, {128});
  EXPECT_EQ(*md::unsupported_router(r), "an expert bias of shape [128] (the kernel reads [256])");
  r = good_router();
  r.expert_bias.stride[0] = 2;
  EXPECT_EQ(*md::unsupported_router(r), "a non-contiguous expert bias");
  r = good_router();
  r.expert_bias.data = addr(0x10004);
  EXPECT_EQ(*md::unsupported_router(r),
            "an expert bias not 16-byte aligned (the kernel reads 16 bytes at a time)");
  r = good_router();
  r.expert_bias.device = -1;
  EXPECT_EQ(*md::unsupported_router(r), "an expert bias in host memory");
  r = good_router();
  r.expert_bias = TensorRef{};
  EXPECT_EQ(*md::unsupported_router(r),
            "a router without an expert bias (the kernel selects by score + an fp32 [256] bias)");
  r = good_router();
  r.top_k = 4;
  EXPECT_EQ(error_of([&] { md::MuseRouting routing(r); }),
            "MuseRouting does not support top-4 of 256 experts (the kernel routes top-8 of 256)");
}

TEST(RouteChecks, GoodCallPasses) {
  Call c;
  EXPECT_EQ(check(c), "(no error)");
  EXPECT_EQ(check(c, false), "(no error)");
  for (int b = 1; b <= 8; ++b) {
    c.logits.shape[0] = c.ids.shape[0] = c.weights.shape[0] = b;
    EXPECT_EQ(check(c), "(no error)") << b;
  }
  c = Call{};
  c.logits.stride[0] = 260;  // a padded row stride, still 16-byte aligned
  c.route_scale = 2.5;
  const md::route_impl::Params p = md::route_impl::params_of(c.args());
  EXPECT_EQ(p.logits, c.logits.data);
  EXPECT_EQ(p.bias, c.bias.data);
  EXPECT_EQ(p.route_scale, 2.5f);
  EXPECT_TRUE(p.pdl);
  EXPECT_EQ(p.logits_stride, 260);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.tile_n, 64);
  EXPECT_EQ(p.local_expert_offset, 32);
  EXPECT_EQ(p.num_local_experts, 64);
}

TEST(RouteChecks, EveryRefusal) {
  Call c;
  c.bias = TensorRef{};
  EXPECT_EQ(check(c), "expert_bias is missing (null data)");
  c = Call{};
  c.bias.dtype = DType::kBFloat16;
  EXPECT_EQ(check(c), "expert_bias must be float32, got bfloat16");
  c = Call{};
  c.bias.device = -1;
  EXPECT_EQ(check(c), "expert_bias must be on a CUDA device, got host memory");
  c = Call{};
  c.bias = md::make_tensor(addr(0x10000), DType::kFloat32, {128});
  EXPECT_EQ(check(c), "expert_bias must be a contiguous [256], got [128]");
  c = Call{};
  c.bias.stride[0] = 2;
  EXPECT_EQ(check(c), "expert_bias must be a contiguous [256], got [256] non-contiguous");
  c = Call{};
  c.bias.data = addr(0x10004);
  EXPECT_EQ(check(c), "expert_bias must be 16-byte aligned, got address 0x10004");
  c = Call{};
  c.route_scale = INFINITY;
  EXPECT_EQ(check(c), "route_scale must be finite, got inf");
  c = Call{};
  c.logits.dtype = DType::kBFloat16;
  EXPECT_EQ(check(c), "logits must be float32, got bfloat16");
  c = Call{};
  c.logits.device = -1;
  EXPECT_EQ(check(c), "logits must be on a CUDA device, got host memory");
  c = Call{};
  c.logits.device = 1;
  EXPECT_EQ(check(c), "logits must be on cuda:0, got cuda:1");
  c = Call{};
  c.logits.shape[0] = 0;
  EXPECT_EQ(check(c), "logits must be [b, 256] with 1 <= b <= 8, got [0, 256]");
  c = Call{};
  c.logits = md::make_tensor(addr(0x20000), DType::kFloat32, {9, 256});
  EXPECT_EQ(check(c), "logits must be [b, 256] with 1 <= b <= 8, got [9, 256]");
  c = Call{};
  c.logits = md::make_tensor(addr(0x20000), DType::kFloat32, {4, 128});
  EXPECT_EQ(check(c), "logits must be [b, 256] with 1 <= b <= 8, got [4, 128]");
  c = Call{};
  c.logits.stride[1] = 2;
  EXPECT_EQ(check(c), "logits must be unit stride along experts, got stride 2");
  c = Call{};
  c.logits.data = addr(0x20008);
  EXPECT_EQ(check(c), "logits must be 16-byte aligned, got address 0x20008");
  c = Call{};
  c.logits.stride[0] = 258;
  EXPECT_EQ(check(c),
            "logits rows must be 16-byte aligned (row stride a multiple of 4 elements, at least 256), "
            "got row stride 258");
  c = Call{};
  c.ids.dtype = DType::kInt64;
  EXPECT_EQ(check(c), "ids must be int32, got int64");
  c = Call{};
  c.ids = md::make_tensor(addr(0x30000), DType::kInt32, {3, 8});
  EXPECT_EQ(check(c), "ids must be a contiguous [4, 8] tensor (b = the logits' rows), got [3, 8]");
  c = Call{};
  c.weights.stride[0] = 16;
  EXPECT_EQ(check(c),
            "weights must be a contiguous [4, 8] tensor (b = the logits' rows), got [4, 8] non-contiguous");
  c = Call{};
  c.weights.dtype = DType::kBFloat16;
  EXPECT_EQ(check(c), "weights must be float32, got bfloat16");
  c = Call{};
  c.weights.data = addr(0x30040);  // inside ids' 128 bytes
  EXPECT_EQ(check(c), "ids and weights must not overlap in memory");
  c = Call{};
  c.ids.data = addr(0x20100);  // inside the logits
  EXPECT_EQ(check(c), "ids and logits must not overlap in memory");
  c = Call{};
  c.weights.data = addr(0x10200);  // inside the bias
  EXPECT_EQ(check(c), "weights and expert_bias must not overlap in memory");
  c = Call{};
  c.meta.buffer.data = addr(0x10000);
  EXPECT_EQ(check(c), "metadata.buffer and expert_bias must not overlap in memory");
  c = Call{};
  c.meta.tile_n = 12;
  EXPECT_EQ(check(c), "metadata.tile_n must be one of 8, 16, 32, 64, 128, 256, got 12");
  c = Call{};
  c.meta.local_expert_offset = 224;
  c.meta.num_local_experts = 64;
  EXPECT_EQ(check(c),
            "metadata.num_local_experts must be in [1, 32] (offset 224 + count within 256 experts), got 64");
  c = Call{};
  c.meta.local_expert_offset = 256;
  c.meta.num_local_experts = 1;
  EXPECT_EQ(check(c), "metadata.local_expert_offset must be in [0, 256), got 256");
  c = Call{};
  c.meta.num_local_experts = 0;
  EXPECT_EQ(check(c),
            "metadata.num_local_experts must be in [1, 224] (offset 32 + count within 256 experts), got 0");
  c = Call{};
  c.meta.buffer.shape[0] = 100;
  EXPECT_EQ(check(c), "metadata.buffer must be at least 4297 int32 elements for tile_n 64, got 100");
  c = Call{};
  c.meta.buffer.dtype = DType::kInt64;
  EXPECT_EQ(check(c), "metadata.buffer must be int32, got int64");
  c = Call{};
  c.meta.buffer.data = addr(0x30000);
  EXPECT_EQ(check(c), "metadata.buffer and ids must not overlap in memory");
  c = Call{};
  c.meta.buffer.data = addr(0x50004);
  EXPECT_EQ(check(c), "metadata.buffer must be 16-byte aligned, got address 0x50004");
  c = Call{};
  c.meta.buffer = TensorRef{};
  EXPECT_EQ(check(c), "metadata.buffer is missing (null data)");
}

TEST(RouteChecks, PdlIsTheDefault) {
  EXPECT_TRUE(md::RouteArgs{}.pdl);
  Call c;
  md::RouteArgs a = c.args();
  a.pdl = false;
  EXPECT_FALSE(md::route_impl::params_of(a).pdl);
}

TEST(RouteDevice, TheOpNeedsPrepareFirst) {
  Call c;
  c.logits.device = c.bias.device = c.ids.device = c.weights.device = c.meta.buffer.device = kUnpreparedDevice;
  EXPECT_EQ(check(c), "(no error)");  // the arguments are good: only the device is missing
  EXPECT_EQ(error_of([&] { md::route(c.args(), nullptr); }), "route on cuda:63 needs prepare_route(63) first");
  // A bad argument is refused first, with its own text.
  c.ids.dtype = DType::kInt64;
  EXPECT_EQ(error_of([&] { md::route(c.args(), nullptr); }), "ids must be int32, got int64");
}

TEST(RouteDevice, PrepareRefusesADeviceTheKernelsCannotRun) {
  const std::string why = error_of([] { md::prepare_route(kUnpreparedDevice); });
  EXPECT_EQ(why, prepare_refusal("route", kUnpreparedDevice));
  if (!md::built_with_cuda()) {
    EXPECT_EQ(why,
              "route runs only on SM90 (H100/H200) or the SM100 family (B200/B300); found: no CUDA device (this "
              "build has no CUDA kernels)");
  }
  // The bound form prepares the bias's device when it is built.
  md::RouterDesc r = good_router();
  r.expert_bias.device = kUnpreparedDevice;
  EXPECT_EQ(error_of([&] { md::MuseRouting routing(r); }), why);
}

// ---------------------------------------------------------------------------
// The reference against the formula in double precision.

namespace {
std::vector<float> random_logits(std::mt19937& rng, int rows, float scale = 3.0f) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(rows) * 256);
  for (auto& v : x) v = n(rng);
  return x;
}
}  // namespace

TEST(RouteReference, MatchesDoubleFormula) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nb(0.0f, 0.05f);
  std::vector<float> bias(256);
  for (auto& b : bias) b = nb(rng);
  int compared = 0, rows = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int b = 1 + trial % 8;
    auto x = random_logits(rng, b);
    std::vector<int32_t> ids(b * 8);
    std::vector<float> w(b * 8);
    md::reference::route(x.data(), b, bias.data(), 1.0f, ids.data(), w.data());
    rows += b;
    for (int t = 0; t < b; ++t) {
      double s[256], key[256];
      int order[256];
      for (int e = 0; e < 256; ++e) {
        s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(x[t * 256 + e])));
        key[e] = s[e] + bias[e];
        order[e] = e;
      }
      std::sort(order, order + 256, [&](int a, int c) { return key[a] > key[c]; });
      // Skip rows whose 8th and 9th keys are too close for float to separate.
      if (key[order[7]] - key[order[8]] < 1e-5) continue;
      double sum = 0;
      for (int k = 0; k < 8; ++k) sum += s[order[k]];
      for (int k = 0; k < 8; ++k) {
        EXPECT_EQ(ids[t * 8 + k], order[k]);
        EXPECT_NEAR(w[t * 8 + k], s[order[k]] / sum, 2e-6);
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, rows * 9 / 10) << "too many near-tied rows skipped";
}

TEST(RouteReference, TiesTakeTheLowerExpert) {
  // Equal logits and bias: every key equal, so ids are 0..7.
  std::vector<float> x(256, 0.5f), bias(256, 0.0f);
  int32_t ids[8];
  float w[8];
  md::reference::route(x.data(), 1, bias.data(), 1.0f, ids, w);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(ids[k], k);
    EXPECT_FLOAT_EQ(w[k], 0.125f);
  }
  // Two groups of exact ties above the rest: each group in index order.
  std::fill(x.begin(), x.end(), -2.0f);
  for (int e : {200, 13, 77}) x[e] = 3.0f;
  for (int e : {250, 5, 100, 42, 199, 1}) x[e] = 1.0f;
  md::reference::route(x.data(), 1, bias.data(), 2.0f, ids, w);
  const int expect[8] = {13, 77, 200, 1, 5, 42, 100, 199};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(ids[k], expect[k]);
  EXPECT_EQ(w[0], w[1]);
  EXPECT_EQ(w[3], w[7]);
  EXPECT_GT(w[0], w[3]);
}

TEST(RouteReference, NaNRanksFirst) {
  std::mt19937 rng(11);
  auto x = random_logits(rng, 1);
  std::vector<float> bias(256, 0.0f);
  x[9] = x[130] = std::numeric_limits<float>::quiet_NaN();
  int32_t ids[8];
  float w[8];
  md::reference::route(x.data(), 1, bias.data(), 1.0f, ids, w);
  EXPECT_EQ(ids[0], 9);
  EXPECT_EQ(ids[1], 130);
  for (float v : w) EXPECT_TRUE(std::isnan(v));  // the sum is NaN
  // A NaN bias also ranks first.
  x = random_logits(rng, 1);
  bias[200] = std::numeric_limits<float>::quiet_NaN();
  md::reference::route(x.data(), 1, bias.data(), 1.0f, ids, w);
  EXPECT_EQ(ids[0], 200);
  EXPECT_FALSE(std::isnan(w[0]));  // the bias only selects
}

// ---------------------------------------------------------------------------
// The metadata builder, checked against the contract's definitions field by field.

namespace {
void check_metadata(const std::vector<int32_t>& ids, int T, int off, int n, int tile) {
  const int32_t kPoison = 0x7eadbeef;
  std::vector<int32_t> meta(md::metadata_size(tile), kPoison);
  md::reference::routing_metadata(ids.data(), T, off, n, tile, meta.data());
  const int R = 8 * T;
  SCOPED_TRACE(::testing::Message() << "T=" << T << " off=" << off << " n=" << n << " tile=" << tile);
  std::vector<int> count(n, 0);
  for (int r = 0; r < R; ++r)
    if (ids[r] >= off && ids[r] < off + n) ++count[ids[r] - off];
  int ctas = 0;
  std::vector<int> first(n);
  for (int j = 0; j < n; ++j) {
    first[j] = ctas;
    ctas += (count[j] + tile - 1) / tile;
  }
  ASSERT_EQ(meta[md::kMetaNumCtas], ctas);
  ASSERT_EQ(meta[md::kMetaPaddedTokens], ctas * tile);
  for (int j = 0; j < n; ++j)
    for (int g = first[j]; g < first[j] + (count[j] + tile - 1) / tile; ++g) {
      EXPECT_EQ(meta[md::kMetaCtaBatch + g], j);
      EXPECT_EQ(meta[md::kMetaCtaLimit + g], std::min((g + 1) * tile, first[j] * tile + count[j]));
    }
  for (int g = ctas; g < md::kMaxRoutes; ++g) {
    EXPECT_EQ(meta[md::kMetaCtaBatch + g], kPoison) << "CTA entry past num_non_exiting_ctas written";
    EXPECT_EQ(meta[md::kMetaCtaLimit + g], kPoison);
  }
  const int32_t* perm = meta.data() + md::kMetaPermutedToToken;
  std::set<int> used;
  std::vector<int> rank(n, 0);
  for (int r = 0; r < R; ++r) {
    const int j = ids[r] - off, t = r / 8;
    const int p = meta[md::kMetaExpandedToPermuted + r];
    if (j < 0 || j >= n) {
      EXPECT_EQ(p, -1);
      continue;
    }
    EXPECT_EQ(p, first[j] * tile + rank[j]++);  // tokens ascending within the expert
    EXPECT_EQ(perm[p], t);
    EXPECT_TRUE(used.insert(p).second);
  }
  for (int r = R; r < md::kMaxRoutes; ++r) EXPECT_EQ(meta[md::kMetaExpandedToPermuted + r], kPoison);
  for (int p = 0; p < ctas * tile; ++p)
    if (!used.count(p)) {
      EXPECT_EQ(perm[p], -1) << "padding row " << p;
    }
  for (int p = ctas * tile; p < md::kMaxRoutes * tile + 1; ++p)
    ASSERT_EQ(perm[p], kPoison) << "row past total_num_padded_tokens (or the guard) written: " << p;
}

std::vector<int32_t> random_ids(std::mt19937& rng, int T, int lo = 0, int hi = 256) {
  std::vector<int32_t> ids;
  for (int t = 0; t < T; ++t) {
    std::vector<int> pool;
    for (int e = lo; e < hi; ++e) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int k = 0; k < 8; ++k) ids.push_back(pool[k]);
  }
  return ids;
}
}  // namespace

TEST(RouteReference, MetadataEveryTileAndSplit) {
  std::mt19937 rng(3);
  const int splits[][2] = {{0, 256}, {0, 32}, {96, 32}, {224, 32}, {17, 1}, {0, 128}, {128, 128}, {255, 1}};
  for (int tile : kTiles)
    for (auto [off, n] : splits)
      for (int T = 1; T <= 8; ++T) {
        check_metadata(random_ids(rng, T), T, off, n, tile);
        // Concentrated on the local range, so experts get several tokens.
        check_metadata(random_ids(rng, T, off, std::min(256, off + std::max(n, 8))), T, off, n, tile);
      }
}

TEST(RouteReference, MetadataAllTokensOnOneExpert) {
  // Every token routes to experts 0..7: eight routes per expert.
  std::vector<int32_t> ids;
  for (int t = 0; t < 8; ++t)
    for (int k = 0; k < 8; ++k) ids.push_back(7 - k);
  for (int tile : kTiles) check_metadata(ids, 8, 0, 256, tile);
  check_metadata(ids, 8, 3, 1, 8);
  check_metadata(ids, 8, 100, 1, 8);  // no local routes at all: zero CTAs
}
