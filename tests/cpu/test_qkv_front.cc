// CPU tests of qkv_front's host layer and reference: shape support, the
// workspace sizing, split_qkv, every refusal reason of the projection and call
// checks (exact text, the same from unsupported_qkv_front_call, check_qkv_front
// and the op), the op and the bound form refusing a device not prepared, and
// the reference against double-precision formulas.
#include <gtest/gtest.h>

#include "check_util.h"
#include "random_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference/qkv_front.h"
#include "qkv_front/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

using muse_decode::testing::addr;
using muse_decode::testing::error_of;
using muse_decode::testing::kUnpreparedDevice;
using muse_decode::testing::prepare_refusal;

// A valid TP8 call (2 KV heads, N = 2304) of 4 tokens.
struct Call {
  int kvh = 2;
  TensorRef x = md::make_tensor(addr(0x100000), DType::kBFloat16, {4, 8192});
  TensorRef weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2304, 8192});
  TensorRef positions = md::make_tensor(addr(0x20000000), DType::kInt64, {4});
  TensorRef cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 64});
  TensorRef slots = md::make_tensor(addr(0x22000000), DType::kInt64, {4});
  TensorRef cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 2, 16, 128});
  TensorRef out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {4, 2304});
  TensorRef workspace = md::make_tensor(addr(0x60000000), DType::kInt32, {1 << 20});

  md::QkvFrontArgs args(bool with_out = true) const {
    md::QkvFrontArgs a;
    a.x = x;
    a.weight = weight;
    a.positions = positions;
    a.cos_sin = cos_sin;
    a.slot_mapping = slots;
    a.kv_cache = cache;
    a.num_kv_heads = kvh;
    if (with_out) {
      a.out = out;
      a.workspace = workspace;
    }
    return a;
  }
  // unsupported_qkv_front_call, without out and workspace unless with_out.
  std::optional<std::string> why(bool with_out = true) const { return md::unsupported_qkv_front_call(args(with_out)); }
  // The text the checked op throws, after checking that check_qkv_front
  // throws the same.
  std::string checked() const {
    const std::string thrown = error_of([&] { md::qkv_front(args(), nullptr); });
    if (thrown.find("needs prepare_qkv_front") == std::string::npos) {
      EXPECT_EQ(error_of([&] { md::check_qkv_front(args()); }), thrown);
    }
    return thrown;
  }
};

md::ProjectionDesc good_projection(bool rope) {
  md::ProjectionDesc a;
  a.num_heads = 16;
  a.num_kv_heads = 2;
  a.tp_size = 8;
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2304, 8192});
  a.use_rope = rope;
  if (rope) {
    a.rotary.present = true;
    a.rotary.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 64});
  }
  return a;
}

}  // namespace

TEST(QkvFrontShape, SupportsShape) {
  for (int kvh : {1, 2, 4, 8, 16}) {
    EXPECT_TRUE(md::qkv_front_supports_shape(2 * 9 * kvh * 64, kvh)) << kvh;
    EXPECT_FALSE(md::qkv_front_supports_shape(2 * 9 * kvh * 64 + 64, kvh)) << kvh;
  }
  EXPECT_TRUE(md::qkv_front_supports_shape(2304, 2));
  EXPECT_TRUE(md::qkv_front_supports_shape(18432, 16));
  EXPECT_FALSE(md::qkv_front_supports_shape(2304, 3));
  EXPECT_FALSE(md::qkv_front_supports_shape(3456, 3));
  EXPECT_FALSE(md::qkv_front_supports_shape(0, 0));
  EXPECT_FALSE(md::qkv_front_supports_shape(36864, 32));
}

TEST(QkvFrontShape, GridAndWorkspaceSizing) {
  EXPECT_EQ(md::qkv_front_ctas(2, 132), 132);
  EXPECT_EQ(md::qkv_front_ctas(16, 132), 132);
  EXPECT_EQ(md::qkv_front_ctas(1, 100000), 18 * 128);  // never more CTAs than blocks
  // TP8 on an H200: 36 tiles -> 256 bytes of counters, (36 + 131) partials of 4 KB.
  EXPECT_EQ(md::qkv_front_workspace_bytes(2, 132), 256 + (36 + 131) * 4096);
  // TP1: 288 tiles -> 1152 bytes of counters rounded to 1280.
  EXPECT_EQ(md::qkv_front_workspace_bytes(16, 132), 1280 + (288 + 131) * 4096);
  EXPECT_EQ(md::qkv_front_workspace_bytes(1, 1), 256 + 18 * 4096);
  EXPECT_EQ(error_of([] { md::qkv_front_ctas(3, 132); }), "num_kv_heads must be one of 1, 2, 4, 8, 16, got 3");
  EXPECT_EQ(error_of([] { md::qkv_front_workspace_bytes(2, 0); }), "sm_count must be at least 1, got 0");
}

// The slot t + c of CTA c's partial of tile t never collides: recompute the
// stream-K split the kernel uses and check the slots of every (CTA, tile).
TEST(QkvFrontShape, PartialSlotsAreDistinctAndInsideTheWorkspace) {
  for (int kvh : {1, 2, 4, 8, 16})
    for (int sms : {1, 7, 78, 114, 132, 148, 200}) {
      const int ctas = md::qkv_front_ctas(kvh, sms);
      const int64_t tiles = md::qkv_width(kvh) / 64, blocks = tiles * 128;
      const int64_t slots = (md::qkv_front_workspace_bytes(kvh, sms) - (tiles * 4 + 255) / 256 * 256) / 4096;
      std::vector<int> used(slots, 0);
      for (int c = 0; c < ctas; ++c) {
        const int64_t b0 = c * blocks / ctas, b1 = (c + 1) * blocks / ctas;
        ASSERT_LT(b0, b1) << "every CTA owns at least one block";
        for (int64_t t = b0 / 128; t <= (b1 - 1) / 128; ++t) {
          ASSERT_LT(t + c, slots);
          ASSERT_EQ(used[t + c]++, 0) << "kvh " << kvh << " sms " << sms << " cta " << c << " tile " << t;
        }
      }
    }
}

TEST(QkvFrontShape, SplitQkvViews) {
  int64_t stride = 2304 + 64;
  TensorRef qkv = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 2304});
  qkv.stride[0] = stride;
  const auto v = md::split_qkv(qkv, 2);
  EXPECT_EQ(v.q.data, qkv.data);
  EXPECT_EQ(v.q.shape[0], 8);
  EXPECT_EQ(v.q.shape[1], 1024);
  EXPECT_EQ(v.q.stride[0], stride);
  EXPECT_EQ(v.gate.data, addr(0x30000000 + (1024 + 256) * 2));
  EXPECT_EQ(v.gate.shape[1], 1024);
  EXPECT_EQ(v.gate.stride[0], stride);
  EXPECT_EQ(v.gate.stride[1], 1);
  const auto v16 = md::split_qkv(md::make_tensor(addr(0x30000000), DType::kBFloat16, {3, 18432}), 16);
  EXPECT_EQ(v16.gate.data, addr(0x30000000 + (8192 + 2048) * 2));
  EXPECT_EQ(v16.q.shape[1], 8192);
  EXPECT_EQ(error_of([] { md::split_qkv(md::make_tensor(addr(0x1000), DType::kBFloat16, {8, 2048}), 2); }),
            "qkv must be [tokens, 2304] for 2 KV heads, got [8, 2048]");
  EXPECT_EQ(error_of([] { md::split_qkv(md::make_tensor(addr(0x1000), DType::kBFloat16, {2304}), 2); }),
            "qkv must be [tokens, 2304] for 2 KV heads, got [2304]");
  EXPECT_EQ(error_of([] { md::split_qkv(md::make_tensor(addr(0x1000), DType::kBFloat16, {8, 2592}), 3); }),
            "num_kv_heads must be one of 1, 2, 4, 8, 16, got 3");
}

TEST(QkvFrontShape, Columns) {
  for (int kvh : {1, 2, 4, 8, 16}) {
    const md::QkvColumns c = md::qkv_front_columns(kvh);
    EXPECT_EQ(c.k, 8 * kvh * 64) << kvh;
    EXPECT_EQ(c.v, c.k + kvh * 64) << kvh;
    EXPECT_EQ(c.gate, c.v + kvh * 64) << kvh;
    EXPECT_EQ(c.width, md::qkv_width(kvh)) << kvh;
  }
  for (int kvh : {-2, 0, 3, 32})
    EXPECT_EQ(error_of([&] { md::qkv_front_columns(kvh); }),
              "num_kv_heads must be one of 1, 2, 4, 8, 16, got " + std::to_string(kvh));
}

TEST(QkvFrontChecks, UnsupportedProjectionReasons) {
  EXPECT_FALSE(md::unsupported_projection(good_projection(true)));
  EXPECT_FALSE(md::unsupported_projection(good_projection(false)));
  auto a = good_projection(true);
  a.quantized = true;
  EXPECT_EQ(*md::unsupported_projection(a), "a quantized QKV projection (the front reads an unquantized bf16 weight)");
  a = good_projection(true);
  a.has_bias = true;
  EXPECT_EQ(*md::unsupported_projection(a), "a QKV projection with a bias (the front adds none)");
  a = good_projection(true);
  a.gather_output = true;
  EXPECT_EQ(*md::unsupported_projection(a),
            "a QKV projection that gathers its output over TP 8 (the front writes this rank's columns)");
  a.tp_size = 1;  // gathering over one rank is no gathering
  EXPECT_FALSE(md::unsupported_projection(a));
  a = good_projection(true);
  a.head_dim = 128;
  EXPECT_EQ(*md::unsupported_projection(a), "head_dim 128 (the front is built for 64)");
  a = good_projection(true);
  a.num_kv_heads = 3;
  a.num_heads = 24;
  EXPECT_EQ(*md::unsupported_projection(a), "3 KV heads per rank (the front serves 1, 2, 4, 8 or 16)");
  a = good_projection(true);
  a.num_heads = 12;
  EXPECT_EQ(*md::unsupported_projection(a), "12 query heads for 2 KV heads (the front needs 8 per KV head)");
  a = good_projection(true);
  a.weight = TensorRef{};
  EXPECT_EQ(*md::unsupported_projection(a), "no QKV weight");
  a = good_projection(true);
  a.weight.dtype = DType::kFloat16;
  EXPECT_EQ(*md::unsupported_projection(a), "a float16 QKV weight (the front reads bfloat16)");
  a = good_projection(true);
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2304, 4096});
  EXPECT_EQ(*md::unsupported_projection(a), "a QKV weight of shape [2304, 4096] (the front reads [2304, 8192])");
  a = good_projection(true);
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2560, 8192});
  EXPECT_EQ(*md::unsupported_projection(a), "a QKV weight of shape [2560, 8192] (the front reads [2304, 8192])");
  a = good_projection(true);
  a.weight.stride[0] = 8200;
  EXPECT_EQ(*md::unsupported_projection(a), "a non-contiguous QKV weight");
  a = good_projection(true);
  a.weight.data = addr(0x10000008);
  EXPECT_EQ(*md::unsupported_projection(a), "a QKV weight not 16-byte aligned (the front reads it with TMA)");
  a = good_projection(true);
  a.weight.device = -1;
  EXPECT_EQ(*md::unsupported_projection(a), "a QKV weight in host memory");
  // Rotary table.
  a = good_projection(false);
  a.rotary.present = true;
  EXPECT_EQ(*md::unsupported_projection(a), "a rotary table on a layer without RoPE");
  a = good_projection(true);
  a.rotary.present = false;
  EXPECT_EQ(*md::unsupported_projection(a), "a RoPE layer without a rotary table");
  a = good_projection(true);
  a.rotary.rotary_dim = 32;
  EXPECT_EQ(*md::unsupported_projection(a), "rotary_dim 32 (the front rotates all 64 dims)");
  a = good_projection(true);
  a.rotary.is_neox_style = true;
  EXPECT_EQ(*md::unsupported_projection(a), "a neox-style rotary table (the front rotates interleaved pairs)");
  a = good_projection(true);
  a.rotary.cos_sin = TensorRef{};
  EXPECT_EQ(*md::unsupported_projection(a), "a rotary embedding without a cos_sin table");
  a = good_projection(true);
  a.rotary.cos_sin.dtype = DType::kBFloat16;
  EXPECT_EQ(*md::unsupported_projection(a), "a bfloat16 rotary table (the front reads float32)");
  a = good_projection(true);
  a.rotary.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 32});
  EXPECT_EQ(*md::unsupported_projection(a), "a rotary table of shape [4096, 32] (the front reads [max_pos, 64])");
  a = good_projection(true);
  a.rotary.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 128});
  a.rotary.cos_sin.shape[1] = 64;  // a column slice of a wider table
  EXPECT_EQ(*md::unsupported_projection(a), "a non-contiguous rotary table");
}

TEST(QkvFrontChecks, ValidCalls) {
  Call c;
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_TRUE(md::qkv_front_supports_call(c.args(false)));
  EXPECT_TRUE(md::qkv_front_supports_call(c.args()));
  // The params of the complete check.
  const md::qkv_front_impl::Params p = md::qkv_front_impl::params_of(c.args());
  EXPECT_EQ(p.x, c.x.data);
  EXPECT_EQ(p.out, c.out.data);
  EXPECT_EQ(p.workspace, c.workspace.data);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.num_kv_heads, 2);
  EXPECT_EQ(p.max_pos, 4096);
  EXPECT_EQ(p.num_slots, 64 * 16);
  EXPECT_EQ(p.num_ctas, md::qkv_front_ctas(2, std::max(md::sm_count(0), 1)));
  // NoPE layer, one token (any row stride), 16 tokens, every KV-head count.
  c.cos_sin = TensorRef{};
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(md::qkv_front_impl::params_of(c.args()).cos_sin, nullptr);
  Call one;
  one.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {1, 8192});
  one.x.stride[0] = 3;  // ignored for one row
  one.positions = md::make_tensor(addr(0x20000000), DType::kInt64, {1});
  one.slots = md::make_tensor(addr(0x22000000), DType::kInt64, {1});
  one.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {1, 2304});
  EXPECT_EQ(one.why(), std::nullopt);
  for (int kvh : {1, 4, 8, 16}) {
    Call k;
    const int64_t n = md::qkv_width(kvh);
    k.kvh = kvh;
    k.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {16, 8192});
    k.x.stride[0] = 8192 + 64;
    k.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {n, 8192});
    k.positions = md::make_tensor(addr(0x20000000), DType::kInt64, {16});
    k.slots = md::make_tensor(addr(0x22000000), DType::kInt64, {16});
    k.cache = md::make_tensor(addr(0x40000000), DType::kBFloat16, {64, kvh, 16, 128});
    k.out = md::make_tensor(addr(0x50000000), DType::kBFloat16, {16, n});
    k.out.stride[0] = n + 8;
    EXPECT_EQ(k.why(), std::nullopt) << kvh;
  }
}

TEST(QkvFrontChecks, UnsupportedCallReasons) {
  struct Case {
    const char* what;
    void (*edit)(Call&);
    const char* reason;
  };
  const Case cases[] = {
      {"x absent", [](Call& c) { c.x = TensorRef{}; }, "x is missing (null data)"},
      {"x dtype", [](Call& c) { c.x.dtype = DType::kFloat32; }, "x must be bfloat16, got float32"},
      {"x host", [](Call& c) { c.x.device = -1; }, "x must be on a CUDA device, got host memory"},
      {"T = 17",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {17, 8192}); },
       "x must be [T, 8192] with 1 <= T <= 16, got [17, 8192]"},
      {"T = 0",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {0, 8192}); },
       "x must be [T, 8192] with 1 <= T <= 16, got [0, 8192]"},
      {"x width",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {4, 4096}); },
       "x must be [T, 8192] with 1 <= T <= 16, got [4, 4096]"},
      {"x 3-D",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {1, 4, 8192}); },
       "x must be [T, 8192] with 1 <= T <= 16, got [1, 4, 8192]"},
      {"x column stride", [](Call& c) { c.x.stride[1] = 2; }, "x must be unit stride along columns, got stride 2"},
      {"x misaligned rows", [](Call& c) { c.x.stride[0] = 8196; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 8196"},
      {"x overlapping rows", [](Call& c) { c.x.stride[0] = 4096; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 4096"},
      {"x misaligned base", [](Call& c) { c.x.data = addr(0x100008); },
       "x must be 16-byte aligned, got address 0x100008"},
      {"num_kv_heads 3", [](Call& c) { c.kvh = 3; }, "num_kv_heads must be one of 1, 2, 4, 8, 16, got 3"},
      {"num_kv_heads 0", [](Call& c) { c.kvh = 0; }, "num_kv_heads must be one of 1, 2, 4, 8, 16, got 0"},
      {"weight device", [](Call& c) { c.weight.device = 1; }, "weight must be on cuda:0, got cuda:1"},
      {"weight dtype", [](Call& c) { c.weight.dtype = DType::kFloat16; }, "weight must be bfloat16, got float16"},
      {"N that does not fit KVH",
       [](Call& c) { c.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2560, 8192}); },
       "weight must be [2304, 8192] for 2 KV heads, got [2560, 8192]"},
      {"KVH that does not fit N", [](Call& c) { c.kvh = 4; },
       "weight must be [4608, 8192] for 4 KV heads, got [2304, 8192]"},
      {"weight strided", [](Call& c) { c.weight.stride[0] = 8200; },
       "weight must be contiguous, got strides [8200, 1]"},
      {"weight misaligned", [](Call& c) { c.weight.data = addr(0x10000002); },
       "weight must be 16-byte aligned, got address 0x10000002"},
      {"positions dtype", [](Call& c) { c.positions.dtype = DType::kInt32; }, "positions must be int64, got int32"},
      {"positions length",
       [](Call& c) { c.positions = md::make_tensor(addr(0x20000000), DType::kInt64, {5}); },
       "positions must be a contiguous [4] (one per token of x), got [5]"},
      {"positions strided", [](Call& c) { c.positions.stride[0] = 2; },
       "positions must be a contiguous [4] (one per token of x), got [4] strided"},
      {"cos_sin dtype", [](Call& c) { c.cos_sin.dtype = DType::kBFloat16; }, "cos_sin must be float32, got bfloat16"},
      {"cos_sin width",
       [](Call& c) { c.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 32}); },
       "cos_sin must be [max_pos, 64] with max_pos >= 1 (cos | sin), got [4096, 32]"},
      {"cos_sin empty",
       [](Call& c) { c.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {0, 64}); },
       "cos_sin must be [max_pos, 64] with max_pos >= 1 (cos | sin), got [0, 64]"},
      {"cos_sin strided", [](Call& c) { c.cos_sin.stride[0] = 128; },
       "cos_sin must be contiguous, got strides [128, 1]"},
      {"cos_sin device", [](Call& c) { c.cos_sin.device = -1; }, "cos_sin must be on a CUDA device, got host memory"},
      {"slot_mapping dtype", [](Call& c) { c.slots.dtype = DType::kInt32; }, "slot_mapping must be int64, got int32"},
      {"slot_mapping length",
       [](Call& c) { c.slots = md::make_tensor(addr(0x22000000), DType::kInt64, {8}); },
       "slot_mapping must be a contiguous [4] (one per token of x), got [8]"},
      {"kv_cache heads",
       [](Call& c) { c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 4, 16, 128}); },
       "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 4, 16, 128]"},
      {"kv_cache page size",
       [](Call& c) { c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 2, 32, 128}); },
       "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 2, 32, 128]"},
      {"kv_cache dtype", [](Call& c) { c.cache.dtype = DType::kFloat16; }, "kv_cache must be bfloat16, got float16"},
      {"kv_cache strided", [](Call& c) { c.cache.stride[0] = 8192; },
       "kv_cache must be contiguous, got strides [8192, 2048, 128, 1]"},
      {"kv_cache misaligned", [](Call& c) { c.cache.data = addr(0x23000004); },
       "kv_cache must be 16-byte aligned, got address 0x23000004"},
      {"out dtype", [](Call& c) { c.out.dtype = DType::kFloat32; }, "out must be bfloat16, got float32"},
      {"out width",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {4, 2048}); },
       "out must be [4, 2304] (tokens of x, qkv width), got [4, 2048]"},
      {"out tokens",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 2304}); },
       "out must be [4, 2304] (tokens of x, qkv width), got [8, 2304]"},
      {"out misaligned rows", [](Call& c) { c.out.stride[0] = 2308; },
       "out rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 2304), got row stride 2308"},
      {"out device", [](Call& c) { c.out.device = 3; }, "out must be on cuda:0, got cuda:3"},
      {"out over x", [](Call& c) { c.out.data = addr(0x100000); }, "out and x must not overlap in memory"},
      {"out over kv_cache", [](Call& c) { c.out.data = addr(0x23000000); },
       "out and kv_cache must not overlap in memory"},
      {"kv_cache over weight", [](Call& c) { c.cache.data = addr(0x10000000); },
       "kv_cache and weight must not overlap in memory"},
      {"kv_cache over positions", [](Call& c) { c.cache.data = addr(0x20000000); },
       "kv_cache and positions must not overlap in memory"},
  };
  for (const Case& k : cases) {
    Call c;
    k.edit(c);
    const auto why = c.why();
    ASSERT_TRUE(why.has_value()) << k.what;
    EXPECT_EQ(*why, k.reason) << k.what;
    EXPECT_EQ(c.checked(), k.reason) << k.what << ": the checked call throws the same text";
  }
  // Without out and workspace, their checks are skipped.
  Call c;
  c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {4, 2048});
  c.workspace.dtype = DType::kOther;
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_FALSE(md::qkv_front_supports_call(c.args()));
  // The checked call needs both.
  c = Call{};
  c.out = TensorRef{};
  EXPECT_EQ(c.checked(), "out is missing (null data)");
  c = Call{};
  c.workspace = TensorRef{};
  EXPECT_EQ(c.checked(), "workspace is missing (null data)");
  EXPECT_EQ(c.why(), std::nullopt);  // out given and checked, workspace absent and skipped
  c.out.dtype = DType::kFloat32;
  EXPECT_EQ(c.why(), "out must be bfloat16, got float32");
}

TEST(QkvFrontChecks, WorkspaceReasons) {
  Call c;
  c.workspace = md::make_tensor(addr(0x60000000), DType::kUInt8, {1000});
  const int sms = md::sm_count(0);
  const int64_t need = md::qkv_front_workspace_bytes(2, std::max(sms, 1));
  const std::string small = "workspace must be a contiguous 1-D buffer of at least " + std::to_string(need) +
                            " bytes (qkv_front_workspace_bytes for 2 KV heads, " + std::to_string(sms) +
                            " SMs), got [1000] of uint8, 1000 bytes";
  EXPECT_EQ(c.why(), small);
  EXPECT_EQ(c.checked(), small);
  c = Call{};
  c.workspace.device = -1;
  EXPECT_EQ(c.checked(), "workspace must be on a CUDA device, got host memory");
  c = Call{};
  c.workspace.data = addr(0x60000004);
  EXPECT_EQ(c.checked(), "workspace must be 16-byte aligned, got address 0x60000004");
  c = Call{};
  c.workspace.data = addr(0x23000000);
  EXPECT_EQ(c.checked(), "workspace and kv_cache must not overlap in memory");
  c = Call{};
  c.workspace.data = addr(0x30000000);
  EXPECT_EQ(c.checked(), "workspace and out must not overlap in memory");
}

TEST(QkvFrontChecks, PdlIsTheDefault) {
  EXPECT_TRUE(md::QkvFrontArgs{}.pdl);
  Call c;
  md::QkvFrontArgs a = c.args();
  EXPECT_TRUE(md::qkv_front_impl::params_of(a).pdl);
  a.pdl = false;
  EXPECT_FALSE(md::qkv_front_impl::params_of(a).pdl);
}

// ---------------------------------------------------------------------------
// Devices.

namespace {
Call on_unprepared_device() {
  Call c;
  for (TensorRef* t : {&c.x, &c.weight, &c.positions, &c.cos_sin, &c.slots, &c.cache, &c.out, &c.workspace})
    t->device = kUnpreparedDevice;
  return c;
}
}  // namespace

TEST(QkvFrontDevice, TheOpNeedsPrepareFirst) {
  Call c = on_unprepared_device();
  EXPECT_EQ(c.why(), std::nullopt);  // the arguments are good: only the device is missing
  EXPECT_EQ(c.checked(), "qkv_front on cuda:63 needs prepare_qkv_front(63) first");
  c.slots.dtype = DType::kInt32;  // a bad argument is refused first, with its own text
  EXPECT_EQ(c.checked(), "slot_mapping must be int64, got int32");
}

TEST(QkvFrontDevice, PrepareRefusesADeviceTheKernelsCannotRun) {
  EXPECT_EQ(error_of([] { md::prepare_qkv_front(kUnpreparedDevice); }),
            prepare_refusal("qkv_front", kUnpreparedDevice));
  // Said once: what the function needs, then what the device is.
  EXPECT_EQ(error_of([] { md::qkv_front_workspace_bytes_for_device(2, kUnpreparedDevice); }),
            "qkv_front_workspace_bytes_for_device needs a CUDA device to size for: " +
                md::describe_device(kUnpreparedDevice));
  EXPECT_EQ(error_of([] { md::qkv_front_workspace_bytes_for_device(3, kUnpreparedDevice); }),
            "num_kv_heads must be one of 1, 2, 4, 8, 16, got 3");
  EXPECT_EQ(error_of([] { md::qkv_front_workspace_bytes_for_device(2, -2); }),
            "device must be -1 (the current device) or an ordinal >= 0, got -2");
}

TEST(QkvFrontDevice, TheBoundFormChecksItsTensorsThenPrepares) {
  const Call c = on_unprepared_device();
  const auto bind = [](const Call& k) {
    return error_of([&] { md::QkvFront front(k.weight, k.cos_sin, k.cache, k.kvh, k.workspace); });
  };
  Call k = c;
  k.kvh = 3;
  EXPECT_EQ(bind(k), "num_kv_heads must be one of 1, 2, 4, 8, 16, got 3");
  k = c;
  k.weight.dtype = DType::kFloat16;
  EXPECT_EQ(bind(k), "weight must be bfloat16, got float16");
  k = c;
  k.cos_sin.device = 0;
  EXPECT_EQ(bind(k), "cos_sin must be on cuda:63, got cuda:0");
  k = c;
  k.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 4, 16, 128}, kUnpreparedDevice);
  EXPECT_EQ(bind(k), "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 4, 16, 128]");
  k = c;
  k.workspace = TensorRef{};
  EXPECT_EQ(bind(k), "workspace is missing (null data)");
  k = c;
  k.workspace.data = k.cache.data;
  EXPECT_EQ(bind(k), "workspace and kv_cache must not overlap in memory");
  const std::string prepare = prepare_refusal("qkv_front", kUnpreparedDevice);
  EXPECT_EQ(bind(c), prepare);
  k = c;
  k.cos_sin = TensorRef{};  // a layer without RoPE
  EXPECT_EQ(bind(k), prepare);
}

// ---------------------------------------------------------------------------
// Reference.

namespace {
using muse_decode::testing::random_bf16;

using muse_decode::testing::rope_table;
}  // namespace

TEST(QkvFrontReference, Bf16Conversion) {
  using md::reference::bf16_bits_to_float;
  using md::reference::float_to_bf16_bits;
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
}

// One-hot weight rows pick single elements of x: the projection is exact.
TEST(QkvFrontReference, ProjectionOfOneHotRows) {
  std::mt19937 rng(7);
  const int kvh = 1, n = md::qkv_width(kvh), T = 3;
  const int64_t stride = 8192 + 8;
  auto x = random_bf16(T * stride, rng, 1.0f);
  std::vector<uint16_t> w(static_cast<size_t>(n) * 8192, 0);
  for (int j = 0; j < n; ++j) w[static_cast<size_t>(j) * 8192 + (j * 7) % 8192] = 0x3F80;  // 1.0
  std::vector<double> y(T * n);
  md::reference::qkv_projection(x.data(), stride, T, w.data(), kvh, y.data());
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j)
      ASSERT_EQ(y[t * n + j], md::reference::bf16_bits_to_float(x[t * stride + (j * 7) % 8192]));
}

// The epilogue against the contract's formulas: q and k heads end with mean square
// m / (m + eps), RoPE keeps each pair's length and turns it by the table's
// angle, v and gate stay the projection, positions past the table clamp.
TEST(QkvFrontReference, EpilogueMatchesFormulas) {
  std::mt19937 rng(11);
  const int kvh = 1, n = md::qkv_width(kvh), T = 4, max_pos = 300;
  auto x = random_bf16(T * 8192, rng, 1.0f);
  auto w = random_bf16(static_cast<size_t>(n) * 8192, rng, 0.02f);
  const auto table = rope_table(max_pos);
  const int64_t positions[T] = {0, 17, max_pos - 1, max_pos + 40};
  std::vector<double> proj(T * n), nope(T * n), rope(T * n);
  md::reference::qkv_projection(x.data(), 8192, T, w.data(), kvh, proj.data());
  md::reference::qkv_front(x.data(), 8192, T, w.data(), kvh, positions, nullptr, 0, nope.data());
  md::reference::qkv_front(x.data(), 8192, T, w.data(), kvh, positions, table.data(), max_pos, rope.data());
  const int qk_heads = 9 * kvh;
  for (int t = 0; t < T; ++t) {
    const int64_t pos = std::min<int64_t>(positions[t], max_pos - 1);
    for (int h = 0; h < 2 * qk_heads; ++h) {
      const double* p = &proj[t * n + h * 64];
      const double* a = &nope[t * n + h * 64];
      const double* r = &rope[t * n + h * 64];
      if (h >= qk_heads) {  // v and gate
        for (int d = 0; d < 64; ++d) {
          ASSERT_EQ(a[d], p[d]);
          ASSERT_EQ(r[d], p[d]);
        }
        continue;
      }
      double m = 0.0, ms = 0.0;
      for (int d = 0; d < 64; ++d) {
        m += p[d] * p[d] / 64;
        ms += a[d] * a[d] / 64;
      }
      const double eps = md::kRmsNormEps;  // the fp32 constant, as the kernel adds it
      EXPECT_NEAR(ms, m / (m + eps), 1e-12);
      for (int d = 0; d < 64; ++d) EXPECT_NEAR(a[d], p[d] / std::sqrt(m + eps), 1e-12);
      for (int j = 0; j < 32; ++j) {
        const double c = table[pos * 64 + j], s = table[pos * 64 + 32 + j];
        EXPECT_NEAR(r[2 * j], a[2 * j] * c - a[2 * j + 1] * s, 1e-12);
        EXPECT_NEAR(r[2 * j + 1], a[2 * j] * s + a[2 * j + 1] * c, 1e-12);
        EXPECT_NEAR(std::hypot(r[2 * j], r[2 * j + 1]), std::hypot(a[2 * j], a[2 * j + 1]), 1e-6);
      }
    }
  }
  // Position 0 is the identity rotation.
  for (int d = 0; d < 64 * qk_heads; ++d) EXPECT_NEAR(rope[d], nope[d], 1e-12);
}
