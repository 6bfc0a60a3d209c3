// CPU tests of o_proj's host layer and reference: the supported widths, every
// refusal reason of the output-projection and call checks (exact text, the
// same from unsupported_o_proj_call, check_o_proj and the op), the launch
// parameters, the op and the bound form refusing a device not prepared, and
// the reference against a double-precision formula.
#include <gtest/gtest.h>

#include "check_util.h"
#include "random_inputs.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/reference/o_proj.h"
#include "o_proj/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

using muse_decode::testing::addr;
using muse_decode::testing::error_of;
using muse_decode::testing::kUnpreparedDevice;
using muse_decode::testing::prepare_refusal;

// A valid TP8 call (K = 1024) of 8 tokens.
struct Call {
  TensorRef x = md::make_tensor(addr(0x100000), DType::kBFloat16, {8, 1024});
  TensorRef weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 1024});
  TensorRef out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 8192});

  md::OProjArgs args(bool with_out = true) const {
    md::OProjArgs a;
    a.x = x;
    a.weight = weight;
    if (with_out) a.out = out;
    return a;
  }
  // unsupported_o_proj_call, without out unless with_out.
  std::optional<std::string> why(bool with_out = true) const { return md::unsupported_o_proj_call(args(with_out)); }
  // The text the checked op throws, after checking that check_o_proj throws
  // the same.
  std::string checked() const {
    const std::string thrown = error_of([&] { md::o_proj(args(), nullptr); });
    if (thrown.find("needs prepare_o_proj") == std::string::npos) {
      EXPECT_EQ(error_of([&] { md::check_o_proj(args()); }), thrown);
    }
    return thrown;
  }
};

md::OutProjectionDesc good_projection() {
  md::OutProjectionDesc a;
  a.num_heads = 16;
  a.tp_size = 8;
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 1024});
  return a;
}

}  // namespace

TEST(OProjShape, InputWidths) {
  EXPECT_EQ(md::o_proj_in_width(1), 512);
  EXPECT_EQ(md::o_proj_in_width(2), 1024);
  EXPECT_EQ(md::o_proj_in_width(16), 8192);
  for (int kvh : {1, 2, 4, 8, 16}) EXPECT_TRUE(md::o_proj_supports_in_width(8 * kvh * 64)) << kvh;
  for (int64_t k : {0, 64, 256, 768, 1000, 1536, 3072, 16384, -1024}) EXPECT_FALSE(md::o_proj_supports_in_width(k)) << k;
}

TEST(OProjChecks, UnsupportedProjectionReasons) {
  EXPECT_FALSE(md::unsupported_o_proj(good_projection()));
  auto a = good_projection();
  a.quantized = true;
  EXPECT_EQ(*md::unsupported_o_proj(a), "a quantized output projection (o_proj reads an unquantized bf16 weight)");
  a = good_projection();
  a.has_bias = true;
  EXPECT_EQ(*md::unsupported_o_proj(a), "an output projection with a bias (o_proj adds none)");
  a = good_projection();
  a.input_is_parallel = false;
  EXPECT_EQ(*md::unsupported_o_proj(a),
            "an output projection whose input is not parallel over TP 8 (o_proj reads this rank's attention output "
            "as it is)");
  a.tp_size = 1;  // one rank's input is the whole input
  a.num_heads = 128;
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 8192});
  EXPECT_FALSE(md::unsupported_o_proj(a));
  a = good_projection();
  a.head_dim = 128;
  EXPECT_EQ(*md::unsupported_o_proj(a), "head_dim 128 (o_proj is built for 64)");
  a = good_projection();
  a.num_heads = 12;
  EXPECT_EQ(*md::unsupported_o_proj(a),
            "12 query heads per rank (o_proj serves 8, 16, 32, 64 or 128: K one of 512, 1024, 2048, 4096, 8192 (8 * "
            "num_kv_heads * 64))");
  a = good_projection();
  a.weight = TensorRef{};
  EXPECT_EQ(*md::unsupported_o_proj(a), "no output-projection weight");
  a = good_projection();
  a.weight.dtype = DType::kFloat16;
  EXPECT_EQ(*md::unsupported_o_proj(a), "a float16 output-projection weight (o_proj reads bfloat16)");
  a = good_projection();
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 2048});
  EXPECT_EQ(*md::unsupported_o_proj(a),
            "an output-projection weight of shape [8192, 2048] (o_proj reads [8192, 1024] for 16 query heads)");
  a = good_projection();
  a.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1024, 8192});  // transposed
  EXPECT_EQ(*md::unsupported_o_proj(a),
            "an output-projection weight of shape [1024, 8192] (o_proj reads [8192, 1024] for 16 query heads)");
  a = good_projection();
  a.weight.stride[0] = 1032;
  EXPECT_EQ(*md::unsupported_o_proj(a), "a non-contiguous output-projection weight");
  a = good_projection();
  a.weight.data = addr(0x10000008);
  EXPECT_EQ(*md::unsupported_o_proj(a), "an output-projection weight not 16-byte aligned (o_proj reads it with TMA)");
  a = good_projection();
  a.weight.device = -1;
  EXPECT_EQ(*md::unsupported_o_proj(a), "an output-projection weight in host memory");
}

TEST(OProjChecks, ValidCalls) {
  Call c;
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_TRUE(md::o_proj_supports_call(c.args(false)));
  EXPECT_TRUE(md::o_proj_supports_call(c.args()));
  const md::o_proj_impl::Params p = md::o_proj_impl::params_of(c.args());
  EXPECT_EQ(p.x, c.x.data);
  EXPECT_EQ(p.x_stride, 1024);
  EXPECT_EQ(p.weight, c.weight.data);
  EXPECT_EQ(p.out, c.out.data);
  EXPECT_EQ(p.out_stride, 8192);
  EXPECT_EQ(p.num_tokens, 8);
  EXPECT_EQ(p.in_width, 1024);
  // One token (any row stride: x and out keep their row width as stride).
  Call one;
  one.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {1, 1024});
  one.x.stride[0] = 3;
  one.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {1, 8192});
  one.out.stride[0] = 5;
  EXPECT_EQ(one.why(), std::nullopt);
  const md::o_proj_impl::Params p1 = md::o_proj_impl::params_of(one.args());
  EXPECT_EQ(p1.x_stride, 1024);
  EXPECT_EQ(p1.out_stride, 8192);
  // Strided rows (column views), 64 tokens, every width.
  for (int kvh : {1, 2, 4, 8, 16}) {
    Call k;
    const int64_t K = md::o_proj_in_width(kvh);
    k.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {64, K});
    k.x.stride[0] = 3 * K;  // e.g. attn2's out inside a wider buffer
    k.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, K});
    k.out = md::make_tensor(addr(0x50000000), DType::kBFloat16, {64, 8192});
    k.out.stride[0] = 8192 + 8;
    EXPECT_EQ(k.why(), std::nullopt) << kvh;
    const md::o_proj_impl::Params pk = md::o_proj_impl::params_of(k.args());
    EXPECT_EQ(pk.x_stride, 3 * K);
    EXPECT_EQ(pk.out_stride, 8192 + 8);
    EXPECT_EQ(pk.in_width, K);
    EXPECT_EQ(pk.num_tokens, 64);
  }
}

TEST(OProjChecks, UnsupportedCallReasons) {
  struct Case {
    const char* what;
    void (*edit)(Call&);
    const char* reason;
  };
  const Case cases[] = {
      {"x absent", [](Call& c) { c.x = TensorRef{}; }, "x is missing (null data)"},
      {"x dtype", [](Call& c) { c.x.dtype = DType::kFloat16; }, "x must be bfloat16, got float16"},
      {"x host", [](Call& c) { c.x.device = -1; }, "x must be on a CUDA device, got host memory"},
      {"T = 65",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {65, 1024}); },
       "x must be [T, K] with 1 <= T <= 64 and K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
       "[65, 1024]"},
      {"T = 0",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {0, 1024}); },
       "x must be [T, K] with 1 <= T <= 64 and K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
       "[0, 1024]"},
      {"x width",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {8, 1536}); },
       "x must be [T, K] with 1 <= T <= 64 and K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
       "[8, 1536]"},
      {"x 3-D",
       [](Call& c) { c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {1, 8, 1024}); },
       "x must be [T, K] with 1 <= T <= 64 and K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
       "[1, 8, 1024]"},
      {"x column stride", [](Call& c) { c.x.stride[1] = 2; }, "x must be unit stride along columns, got stride 2"},
      {"x misaligned rows", [](Call& c) { c.x.stride[0] = 1028; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 1024), got row stride 1028"},
      {"x overlapping rows", [](Call& c) { c.x.stride[0] = 512; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 1024), got row stride 512"},
      {"x misaligned base", [](Call& c) { c.x.data = addr(0x100008); },
       "x must be 16-byte aligned, got address 0x100008"},
      {"weight absent", [](Call& c) { c.weight = TensorRef{}; }, "weight is missing (null data)"},
      {"weight dtype", [](Call& c) { c.weight.dtype = DType::kFloat32; }, "weight must be bfloat16, got float32"},
      {"weight device", [](Call& c) { c.weight.device = 1; }, "weight must be on cuda:0, got cuda:1"},
      {"weight of another K",
       [](Call& c) { c.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 2048}); },
       "weight must be [8192, 1024] (x's width), got [8192, 2048]"},
      {"weight transposed",
       [](Call& c) { c.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1024, 8192}); },
       "weight must be [8192, 1024] (x's width), got [1024, 8192]"},
      {"weight strided", [](Call& c) { c.weight.stride[0] = 1032; },
       "weight must be contiguous, got strides [1032, 1]"},
      {"weight misaligned", [](Call& c) { c.weight.data = addr(0x10000002); },
       "weight must be 16-byte aligned, got address 0x10000002"},
      {"out dtype", [](Call& c) { c.out.dtype = DType::kFloat32; }, "out must be bfloat16, got float32"},
      {"out host", [](Call& c) { c.out.device = -1; }, "out must be on a CUDA device, got host memory"},
      {"out device", [](Call& c) { c.out.device = 3; }, "out must be on cuda:0, got cuda:3"},
      {"out width",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 4096}); },
       "out must be [8, 8192] (tokens of x, hidden size), got [8, 4096]"},
      {"out tokens",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {16, 8192}); },
       "out must be [8, 8192] (tokens of x, hidden size), got [16, 8192]"},
      {"out column stride", [](Call& c) { c.out.stride[1] = 8; }, "out must be unit stride along columns, got stride 8"},
      {"out misaligned rows", [](Call& c) { c.out.stride[0] = 8196; },
       "out rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 8196"},
      {"out misaligned base", [](Call& c) { c.out.data = addr(0x30000004); },
       "out must be 16-byte aligned, got address 0x30000004"},
      {"out over x", [](Call& c) { c.out.data = addr(0x100000 - 16); }, "out and x must not overlap in memory"},
      {"out over weight", [](Call& c) { c.out.data = addr(0x10000000 + 2 * 8192 * 1024 - 16); },
       "out and weight must not overlap in memory"},
  };
  for (const Case& k : cases) {
    Call c;
    k.edit(c);
    const auto why = c.why();
    ASSERT_TRUE(why.has_value()) << k.what;
    EXPECT_EQ(*why, k.reason) << k.what;
    EXPECT_EQ(c.checked(), k.reason) << k.what << ": the checked call throws the same text";
  }
  // Without out, its checks are skipped; the checked call needs it.
  Call c;
  c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 4096});
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_FALSE(md::o_proj_supports_call(c.args()));
  EXPECT_EQ(c.why(), "out must be [8, 8192] (tokens of x, hidden size), got [8, 4096]");
  c = Call{};
  c.out = TensorRef{};
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(c.checked(), "out is missing (null data)");
  // Adjacent buffers do not overlap.
  c = Call{};
  c.out.data = addr(0x100000 + 8 * 1024 * 2);
  EXPECT_EQ(c.why(), std::nullopt);
}

TEST(OProjChecks, PdlIsTheDefault) {
  EXPECT_TRUE(md::OProjArgs{}.pdl);
  Call c;
  md::OProjArgs a = c.args();
  EXPECT_TRUE(md::o_proj_impl::params_of(a).pdl);
  a.pdl = false;
  EXPECT_FALSE(md::o_proj_impl::params_of(a).pdl);
}

// ---------------------------------------------------------------------------
// Devices.

namespace {
Call on_unprepared_device() {
  Call c;
  for (TensorRef* t : {&c.x, &c.weight, &c.out}) t->device = kUnpreparedDevice;
  return c;
}
}  // namespace

TEST(OProjDevice, TheOpNeedsPrepareFirst) {
  Call c = on_unprepared_device();
  EXPECT_EQ(c.why(), std::nullopt);  // the arguments are good: only the device is missing
  EXPECT_EQ(c.checked(), "o_proj on cuda:63 needs prepare_o_proj(63) first");
  c.out.dtype = DType::kFloat32;  // a bad argument is refused first, with its own text
  EXPECT_EQ(c.checked(), "out must be bfloat16, got float32");
}

TEST(OProjDevice, PrepareRefusesADeviceTheKernelsCannotRun) {
  EXPECT_EQ(error_of([] { md::prepare_o_proj(kUnpreparedDevice); }), prepare_refusal("o_proj", kUnpreparedDevice));
}

TEST(OProjDevice, TheBoundFormChecksItsWeightThenPrepares) {
  const Call c = on_unprepared_device();
  const auto bind = [](const TensorRef& w) { return error_of([&] { md::OProj op(w); }); };
  TensorRef w = c.weight;
  w.dtype = DType::kFloat16;
  EXPECT_EQ(bind(w), "weight must be bfloat16, got float16");
  w = md::make_tensor(addr(0x10000000), DType::kBFloat16, {8192, 1536}, kUnpreparedDevice);
  EXPECT_EQ(bind(w),
            "weight must be [8192, K] with K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
            "[8192, 1536]");
  w = c.weight;
  w.device = -1;
  EXPECT_EQ(bind(w), "weight must be on a CUDA device, got host memory");
  w = c.weight;
  w.stride[0] = 2048;
  EXPECT_EQ(bind(w), "weight must be contiguous, got strides [2048, 1]");
  EXPECT_EQ(bind(c.weight), prepare_refusal("o_proj", kUnpreparedDevice));
}

// ---------------------------------------------------------------------------
// Reference.

namespace {
using muse_decode::testing::random_bf16;
}  // namespace

// The fp32 reference against sum_k x[t, k] w[n, k] in double: within the
// fp32 summation's error bound (K ulps of the sum of |products|) before the
// bf16 rounding, within half a bf16 ulp after it; strided rows of x and out,
// and out's elements outside [T, 8192] untouched.
TEST(OProjReference, MatchesTheDoubleFormula) {
  std::mt19937 rng(5);
  const int K = 512, T = 3;
  const int64_t x_stride = K + 8, out_stride = 8192 + 16;
  const auto x = random_bf16(T * x_stride, rng, 1.0f);
  const auto w = random_bf16(static_cast<size_t>(8192) * K, rng, 0.05f);
  std::vector<uint16_t> out(T * out_stride, 0xABCD);
  md::reference::o_proj(x.data(), x_stride, T, w.data(), K, out.data(), out_stride);
  std::vector<double> y(T * 8192);
  md::reference::o_proj_exact(x.data(), x_stride, T, w.data(), K, y.data());
  for (int t = 0; t < T; ++t) {
    for (int n = 0; n < 8192; ++n) {
      double exact = 0.0, magnitude = 0.0;
      for (int k = 0; k < K; ++k) {
        const double p = static_cast<double>(md::reference::bf16_bits_to_float(x[t * x_stride + k])) *
                         md::reference::bf16_bits_to_float(w[static_cast<size_t>(n) * K + k]);
        exact += p;
        magnitude += std::fabs(p);
      }
      ASSERT_EQ(y[t * 8192 + n], exact);  // the double form is the formula itself
      const double got = md::reference::bf16_bits_to_float(out[t * out_stride + n]);
      const double fp32_bound = K * std::ldexp(magnitude, -22);  // K roundings of 2^-24, with slack
      // bf16 keeps 8 significant bits: half an ulp is 2^-9 of the value (or less).
      ASSERT_LE(std::fabs(got - exact), std::ldexp(std::fabs(exact), -8) + fp32_bound) << t << " " << n;
    }
    for (int64_t n = 8192; n < out_stride; ++n) ASSERT_EQ(out[t * out_stride + n], 0xABCD);
  }
}

// One-hot weight rows pick single elements of x: every sum is exact and so is
// its bf16 (x is bf16 already).
TEST(OProjReference, OneHotRowsAreExact) {
  std::mt19937 rng(9);
  const int K = 1024, T = 5;
  const auto x = random_bf16(T * K, rng, 4.0f);
  std::vector<uint16_t> w(static_cast<size_t>(8192) * K, 0);
  for (int n = 0; n < 8192; ++n) w[static_cast<size_t>(n) * K + (n * 13) % K] = 0x3F80;  // 1.0
  std::vector<uint16_t> out(T * 8192);
  md::reference::o_proj(x.data(), K, T, w.data(), K, out.data(), 8192);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < 8192; ++n) ASSERT_EQ(out[t * 8192 + n], x[t * K + (n * 13) % K]) << t << " " << n;
}
