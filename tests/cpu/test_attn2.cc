// CPU tests of attn2's host layer and reference: the sizing functions, every
// refusal reason of unsupported_attn2 and check_attn2 (exact text, the same
// from unsupported_attn2_call), the parameters a good call produces, the op
// and the bound form refusing a device not prepared, and the reference
// against closed-form answers (uniform attention, a window of one key, page
// indirection).
#include <gtest/gtest.h>

#include "check_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/attn2.h"
#include "muse_decode/reference.h"
#include "muse_decode/reference/attn2.h"
#include "attn2/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

using muse_decode::testing::addr;
using muse_decode::testing::error_of;
using muse_decode::testing::kUnpreparedDevice;
using muse_decode::testing::prepare_refusal;

TensorRef strided(void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int device = 0) {
  TensorRef t = md::make_tensor(data, dtype, {rows, cols}, device);
  t.stride[0] = row_stride;
  return t;
}

// A good TP8 call: 1 request, max_model_len 131072 (15 slices); q and gate
// are column views of one qkv buffer [8, 2304].
struct Call {
  md::Attn2Args a;
  Call(int reqs = 1, int kvh = 2, int mml = 131072) {
    const int64_t n = md::qkv_width(kvh), width = 8 * kvh * 64;
    const uintptr_t qkv = 0x1000000;
    a.q = strided(addr(qkv), DType::kBFloat16, reqs * 8, width, n);
    a.gate = strided(addr(qkv + 2 * (width + 2 * kvh * 64)), DType::kBFloat16, reqs * 8, width, n);
    a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, kvh, 16, 128});
    a.block_table = md::make_tensor(addr(0x2000000), DType::kInt32, {reqs, (mml + 15) / 16});
    a.seq_lens = md::make_tensor(addr(0x3000000), DType::kInt32, {reqs});
    a.out = md::make_tensor(addr(0x4000000), DType::kBFloat16, {reqs * 8, width});
    a.max_model_len = mml;
    a.window = 0;
    a.num_splits = md::attn2_splits(mml, 0, kvh);
    const int64_t ws = md::attn2_workspace_bytes(reqs, kvh, a.num_splits);
    a.workspace = md::make_tensor(addr(0x5000000), DType::kInt32, {(ws + 3) / 4});
  }
  // The text check_attn2 throws, after checking that unsupported_attn2_call
  // returns the same.
  std::string check() const {
    const std::string thrown = error_of([&] { md::check_attn2(a); });
    EXPECT_EQ(md::unsupported_attn2_call(a).value_or("(no error)"), thrown);
    return thrown;
  }
};

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

// ---- sizing -----------------------------------------------------------------------

TEST(Attn2Sizing, Window) {
  EXPECT_EQ(md::attn2_window(std::nullopt, 131072), 0);
  EXPECT_EQ(md::attn2_window(2048, 131072), 2048);
  EXPECT_EQ(md::attn2_window(2048, 2049), 2048);
  EXPECT_EQ(md::attn2_window(2048, 2048), 0);  // the window covers every key
  EXPECT_EQ(md::attn2_window(100, 2048), 100);
  EXPECT_EQ(md::attn2_window(1, 8), 1);
  EXPECT_EQ(error_of([] { md::attn2_window(0, 2048); }), "sliding_window must be at least 1 (or none), got 0");
  EXPECT_EQ(error_of([] { md::attn2_window(-5, 2048); }), "sliding_window must be at least 1 (or none), got -5");
  // max_model_len is checked whether or not the layer has a window.
  EXPECT_EQ(error_of([] { md::attn2_window(2048, -5); }), "max_model_len must be at least 8, got -5");
  EXPECT_EQ(error_of([] { md::attn2_window(std::nullopt, 7); }), "max_model_len must be at least 8, got 7");
}

TEST(Attn2Sizing, Splits) {
  const md::Attn2Residency& h200 = md::kH200Attn2Residency;
  EXPECT_EQ(md::attn2_splits(2048, 0, 2, h200), 1);
  EXPECT_EQ(md::attn2_splits(131072, 2048, 2, h200), 1);
  EXPECT_EQ(md::attn2_splits(131072, 100, 16, h200), 1);
  EXPECT_EQ(md::attn2_splits(131072, 0, 2, h200), 7);    // TP8: 7 clusters of 16 = 224 CTAs, one wave
  EXPECT_EQ(md::attn2_splits(131072, 0, 4, h200), 7);    // TP4: 224 CTAs
  EXPECT_EQ(md::attn2_splits(131072, 0, 16, h200), 2);   // TP1: at least 2
  EXPECT_EQ(md::attn2_splits(131072, 0, 1, h200), 14);
  EXPECT_EQ(md::attn2_splits(131072, 0, 3, h200), 10);   // 240 / (8 * 3)
  EXPECT_EQ(md::attn2_splits(131072, 0, 5, h200), 6);    // 240 / (8 * 5)
  EXPECT_EQ(md::attn2_splits(4096, 0, 2, h200), 2);      // 32 groups of 128 keys: 2 clusters of 16
  EXPECT_EQ(md::attn2_splits(2049, 0, 2, h200), 2);      // 17 groups
  for (int mml : {2049, 4096, 8192, 32768, 131072, 1 << 20})
    for (int kvh = 1; kvh <= 16; ++kvh) {
      const int s = md::attn2_splits(mml, 0, kvh, h200);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, md::kAttn2MaxSplits);
    }
}

// The slices fill the residency given, as a split heuristic takes the SM
// count: a GPU of twice the H200's co-resident CTAs takes twice the slices,
// one that places no cluster of 16 (0 resident) the minimum of 2.
TEST(Attn2Sizing, SplitsFollowTheResidency) {
  const md::Attn2Residency big{16, 480, 448};
  EXPECT_EQ(md::attn2_splits(131072, 0, 2, big), 14);
  EXPECT_EQ(md::attn2_splits(131072, 0, 4, big), 15);
  EXPECT_EQ(md::attn2_splits(131072, 0, 16, big), 3);
  const md::Attn2Residency none{8, 0, 0};
  EXPECT_EQ(md::attn2_splits(131072, 0, 2, none), 2);
  EXPECT_EQ(md::attn2_splits(131072, 0, 8, none), 2);
  // The current device's: the H200's on a host without a supported GPU.
  if (!md::supported_family(md::gpu_family()))
    EXPECT_EQ(md::attn2_splits(131072, 0, 2), md::attn2_splits(131072, 0, 2, md::kH200Attn2Residency));
}

TEST(Attn2Sizing, SplitsCheckEveryArgument) {
  const md::Attn2Residency& h200 = md::kH200Attn2Residency;
  EXPECT_EQ(error_of([&] { md::attn2_splits(-5, 0, 2, h200); }), "max_model_len must be at least 8, got -5");
  EXPECT_EQ(error_of([&] { md::attn2_splits(7, 0, 2, h200); }), "max_model_len must be at least 8, got 7");
  EXPECT_EQ(error_of([&] { md::attn2_splits(32768, -1, 2, h200); }),
            "window must be 0 or in [1, max_model_len) (see attn2_window), got -1");
  EXPECT_EQ(error_of([&] { md::attn2_splits(2048, 2048, 2, h200); }),
            "window must be 0 or in [1, max_model_len) (see attn2_window), got 2048");
  // Any KV-head count of a rank of Muse Spark's 16.
  for (int kvh : {-1, 0, 17, 32, 64})
    EXPECT_EQ(error_of([&] { md::attn2_splits(32768, 0, kvh, h200); }),
              "num_kv_heads must be in [1, 16], got " + std::to_string(kvh));
  for (int kvh = 1; kvh <= 16; ++kvh) EXPECT_EQ(error_of([&] { md::attn2_splits(32768, 0, kvh, h200); }), "(no error)");
  // Checked on the short and windowed paths too, which need no heuristic.
  EXPECT_EQ(error_of([&] { md::attn2_splits(2048, 0, 17, h200); }), "num_kv_heads must be in [1, 16], got 17");
  EXPECT_EQ(error_of([&] { md::attn2_splits(131072, 2048, 0, h200); }), "num_kv_heads must be in [1, 16], got 0");
  EXPECT_EQ(error_of([] { md::attn2_splits(131072, 2048, 0); }), "num_kv_heads must be in [1, 16], got 0");
}

// A cap on the cluster size from the environment must be 8 or 16; anything
// else fails prepare_attn2 before it looks for a device, naming the variable.
TEST(Attn2Prepare, MaxClusterFromEnvironment) {
  const char* before = std::getenv("MUSE_DECODE_ATTN2_MAX_CLUSTER");
  const std::string saved = before ? before : "";
  ASSERT_EQ(setenv("MUSE_DECODE_ATTN2_MAX_CLUSTER", "12", 1), 0);
  try {
    md::prepare_attn2();
    ADD_FAILURE() << "prepare_attn2 took MUSE_DECODE_ATTN2_MAX_CLUSTER=12";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MUSE_DECODE_ATTN2_MAX_CLUSTER"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'12'"), std::string::npos) << e.what();
  }
  if (before) setenv("MUSE_DECODE_ATTN2_MAX_CLUSTER", saved.c_str(), 1);
  else unsetenv("MUSE_DECODE_ATTN2_MAX_CLUSTER");
}

TEST(Attn2Sizing, WorkspaceBytes) {
  EXPECT_EQ(md::attn2_workspace_bytes(1, 2, 1), 0);
  EXPECT_EQ(md::attn2_workspace_bytes(8, 16, 1), 0);
  // counters padded to 256 bytes, then (m, l) and 64 floats per row and slice.
  EXPECT_EQ(md::attn2_workspace_bytes(1, 2, 16), 256 + 2 * 16 * 64 * 66 * 4);
  EXPECT_EQ(md::attn2_workspace_bytes(8, 16, 2), 128 * 16 * 4 + 128 * 2 * 64 * 66 * 4);
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(0, 2, 4); }), "num_reqs must be in [1, 65535], got 0");
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(-3, 2, 4); }), "num_reqs must be in [1, 65535], got -3");
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(65536, 2, 4); }), "num_reqs must be in [1, 65535], got 65536");
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(1, 0, 4); }), "num_kv_heads must be in [1, 16], got 0");
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(1, 17, 8); }), "num_kv_heads must be in [1, 16], got 17");
  EXPECT_EQ(md::attn2_workspace_bytes(1, 3, 8), 256 + 3 * 8 * 64 * 66 * 4);
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(1, 2, 33); }), "num_splits must be in [1, 32], got 33");
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(1, 2, 0); }), "num_splits must be in [1, 32], got 0");
  // Every argument is checked even where the answer is 0.
  EXPECT_EQ(error_of([] { md::attn2_workspace_bytes(1, 17, 1); }), "num_kv_heads must be in [1, 16], got 17");
}

TEST(Attn2Sizing, UnsupportedLayer) {
  EXPECT_EQ(md::unsupported_attn2(md::Attn2Layer{}), std::nullopt);
  md::Attn2Layer tp1;
  tp1.num_heads = 128;
  tp1.num_kv_heads = 16;
  EXPECT_EQ(md::unsupported_attn2(tp1), std::nullopt);
  auto why = [](auto edit) {
    md::Attn2Layer l;
    edit(l);
    return md::unsupported_attn2(l).value_or("(supported)");
  };
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.use_o_norm = false; }), "the layer has no o-norm with a sigmoid o-gate");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.use_o_gate = false; }), "the layer has no o-norm with a sigmoid o-gate");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.head_dim = 128; }), "head_dim 128 (the kernel has 64)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.num_heads = 12; }),
            "12 query heads for 2 KV heads (the kernel has 8 per KV head)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.num_heads = 24, l.num_kv_heads = 3; }), "(supported)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.num_heads = 40, l.num_kv_heads = 5; }), "(supported)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.num_heads = 136, l.num_kv_heads = 17; }),
            "17 KV heads per rank (the kernel serves 1 to 16)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.num_heads = 0, l.num_kv_heads = 0; }),
            "0 KV heads per rank (the kernel serves 1 to 16)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.scaling = 0.125; }),
            "softmax scale 0.125 (the kernel is built for 0.6841258107984375)");
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.rms_norm_eps = 1e-6; }),
            "o-norm eps 1e-06 (the kernel is built for 1e-05)");
  // The scale compared in fp32, as the kernel holds it.
  EXPECT_EQ(why([](md::Attn2Layer& l) { l.scaling = 0.125 * 5.4730064863875; }), "(supported)");
}

// ---- per-call checks ------------------------------------------------------------------

TEST(Attn2Check, GoodCallFillsTheParams) {
  Call c;
  const md::attn2_impl::Params p = md::attn2_impl::params_of(c.a, md::kH200Attn2Residency);
  EXPECT_EQ(p.q, c.a.q.data);
  EXPECT_EQ(p.q_stride, 2304);
  EXPECT_EQ(p.gate_stride, 2304);
  EXPECT_EQ(p.out_stride, 1024);
  EXPECT_EQ(p.num_pages, 1000);
  EXPECT_EQ(p.num_kv_heads, 2);
  EXPECT_EQ(p.num_reqs, 1);
  EXPECT_EQ(p.block_table_stride, 8192);
  EXPECT_EQ(p.num_splits, 7);
  EXPECT_EQ(p.cluster_size, 16);
  EXPECT_EQ(p.workspace, c.a.workspace.data);
  EXPECT_EQ(p.max_model_len, 131072);
  // 7 x 16 x 2 = 224 CTAs: the H200's whole residency with clusters of 16.
  EXPECT_TRUE(p.idle_last);
  EXPECT_TRUE(p.resident);
  EXPECT_EQ(p.window, 0);

  Call s(3, 16, 2048);  // one slice: no workspace needed
  s.a.workspace = TensorRef{};
  const md::attn2_impl::Params ps = md::attn2_impl::params_of(s.a, md::kH200Attn2Residency);
  EXPECT_EQ(ps.num_splits, 1);
  EXPECT_EQ(ps.cluster_size, 16);
  EXPECT_EQ(ps.workspace, nullptr);
  EXPECT_EQ(ps.num_reqs, 3);
  EXPECT_FALSE(ps.idle_last);
  EXPECT_FALSE(ps.resident);

  Call w(1, 2, 131072);  // a window: one slice
  w.a.window = 2048;
  w.a.num_splits = md::attn2_splits(131072, 2048, 2);
  EXPECT_EQ(w.check(), "(no error)");
}

// The fields a device decides, filled from the residency given: clusters of
// 8 where the GPU cannot place 16; a grid that fills the GPU exactly has its
// last cluster placed last (idle_last); one that fits merges without tickets.
TEST(Attn2Check, ParamsFollowTheResidency) {
  Call c;
  const md::attn2_impl::Params no16 = md::attn2_impl::params_of(c.a, md::Attn2Residency{8, 240, 0});
  EXPECT_EQ(no16.cluster_size, 8);
  EXPECT_FALSE(no16.idle_last);  // 7 x 8 x 2 = 112 CTAs of 240
  EXPECT_TRUE(no16.resident);
  const md::attn2_impl::Params big = md::attn2_impl::params_of(c.a, md::Attn2Residency{16, 480, 448});
  EXPECT_EQ(big.cluster_size, 16);
  EXPECT_FALSE(big.idle_last);
  EXPECT_TRUE(big.resident);
  const md::attn2_impl::Params small = md::attn2_impl::params_of(c.a, md::Attn2Residency{16, 120, 112});
  EXPECT_FALSE(small.idle_last);
  EXPECT_FALSE(small.resident);  // two waves: tickets decide the merging slice
  Call s(3, 16, 2048);  // one slice: clusters of 16 where placed, no split merge
  s.a.workspace = TensorRef{};
  EXPECT_EQ(md::attn2_impl::params_of(s.a, md::Attn2Residency{8, 240, 0}).cluster_size, 8);
  EXPECT_EQ(md::attn2_impl::params_of(s.a, md::kH200Attn2Residency).cluster_size, 16);
}

TEST(Attn2Check, PdlIsTheDefault) {
  EXPECT_TRUE(md::Attn2Args{}.pdl);
  Call c;
  EXPECT_TRUE(md::attn2_impl::params_of(c.a, md::kH200Attn2Residency).pdl);
  c.a.pdl = false;
  EXPECT_FALSE(md::attn2_impl::params_of(c.a, md::kH200Attn2Residency).pdl);
}

TEST(Attn2Check, ScalarReasons) {
  Call c;
  c.a.max_model_len = 4;
  EXPECT_EQ(c.check(), "max_model_len must be at least 8, got 4");
  c = Call();
  c.a.window = 131072;
  EXPECT_EQ(c.check(), "window must be 0 or in [1, max_model_len) (see attn2_window), got 131072");
  c.a.window = -1;
  EXPECT_EQ(c.check(), "window must be 0 or in [1, max_model_len) (see attn2_window), got -1");
  c = Call();
  c.a.num_splits = 0;
  EXPECT_EQ(c.check(), "num_splits must be in [1, 32], got 0");
  c.a.num_splits = 33;
  EXPECT_EQ(c.check(), "num_splits must be in [1, 32], got 33");
}

TEST(Attn2Check, CacheReasons) {
  Call c;
  c.a.kv_cache = TensorRef{};
  EXPECT_EQ(c.check(), "kv_cache is missing (null data)");
  c = Call();
  c.a.kv_cache.dtype = DType::kFloat16;
  EXPECT_EQ(c.check(), "kv_cache must be bfloat16, got float16");
  c = Call();
  c.a.kv_cache.device = -1;
  EXPECT_EQ(c.check(), "kv_cache must be on a CUDA device, got host memory");
  c = Call();
  c.a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, 2, 16, 64});
  EXPECT_EQ(c.check(), "kv_cache must be [pages, KVH, 16, 128], got [1000, 2, 16, 64]");
  c.a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, 2, 32, 128});
  EXPECT_EQ(c.check(), "kv_cache must be [pages, KVH, 16, 128], got [1000, 2, 32, 128]");
  c.a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, 17, 16, 128});
  EXPECT_EQ(c.check(), "kv_cache KV heads must be in [1, 16], got 17");
  c.a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, 32, 16, 128});
  EXPECT_EQ(c.check(), "kv_cache KV heads must be in [1, 16], got 32");
  c = Call();
  c.a.kv_cache.stride[0] *= 2;
  EXPECT_EQ(c.check(), "kv_cache must be contiguous, got a strided tensor");
  c = Call();
  c.a.kv_cache.data = addr(0x10000008);
  EXPECT_EQ(c.check(), "kv_cache must be 16-byte aligned, got address 0x10000008");
  // KVH comes from the cache: a cache of 4 KV heads no longer fits q of 2.
  c = Call();
  c.a.kv_cache = md::make_tensor(addr(0x10000000), DType::kBFloat16, {1000, 4, 16, 128});
  EXPECT_EQ(c.check(), "q must be [8, 2048] (R * 8 rows, 8 * KVH heads of 64), got [8, 1024]");
}

TEST(Attn2Check, LengthAndTableReasons) {
  Call c;
  c.a.seq_lens.dtype = DType::kInt64;
  EXPECT_EQ(c.check(), "seq_lens must be int32, got int64");
  c = Call();
  c.a.seq_lens.device = 1;
  EXPECT_EQ(c.check(), "seq_lens must be on cuda:0, got cuda:1");
  c = Call();
  c.a.seq_lens = md::make_tensor(addr(0x3000000), DType::kInt32, {1, 1});
  EXPECT_EQ(c.check(), "seq_lens must be [R] with 1 <= R <= 65535, got [1, 1]");
  c = Call();
  c.a.seq_lens = md::make_tensor(addr(0x3000000), DType::kInt32, {2});
  EXPECT_EQ(c.check(), "block_table must be [2, >= 8192] (R, ceil(max_model_len / 16)), got [1, 8192]");
  c = Call();
  c.a.block_table.dtype = DType::kInt64;
  EXPECT_EQ(c.check(), "block_table must be int32, got int64");
  c = Call();
  c.a.block_table = md::make_tensor(addr(0x2000000), DType::kInt32, {1, 8191});
  EXPECT_EQ(c.check(), "block_table must be [1, >= 8192] (R, ceil(max_model_len / 16)), got [1, 8191]");
  c = Call();
  c.a.block_table.stride[1] = 2;
  EXPECT_EQ(c.check(), "block_table must be unit column stride, got stride 2");
  c = Call(3);
  c.a.block_table.stride[0] = 100;
  EXPECT_EQ(c.check(), "block_table row stride must be at least 8192, got 100");
  c = Call();
  c.a.block_table.device = -1;
  EXPECT_EQ(c.check(), "block_table must be on a CUDA device, got host memory");
}

TEST(Attn2Check, RowTensorReasons) {
  Call c;
  c.a.q.dtype = DType::kFloat32;
  EXPECT_EQ(c.check(), "q must be bfloat16, got float32");
  c = Call();
  c.a.gate = strided(c.a.gate.data, DType::kBFloat16, 8, 512, 2304);
  EXPECT_EQ(c.check(), "gate must be [8, 1024] (R * 8 rows, 8 * KVH heads of 64), got [8, 512]");
  c = Call();
  c.a.out = strided(c.a.out.data, DType::kBFloat16, 16, 1024, 1024);
  EXPECT_EQ(c.check(), "out must be [8, 1024] (R * 8 rows, 8 * KVH heads of 64), got [16, 1024]");
  c = Call();
  c.a.q.stride[0] = 2300;
  EXPECT_EQ(c.check(), "q row stride must be a multiple of 8 elements (16 bytes), at least 1024, got 2300");
  c.a.q.stride[0] = 1016;
  EXPECT_EQ(c.check(), "q row stride must be a multiple of 8 elements (16 bytes), at least 1024, got 1016");
  c = Call();
  c.a.gate.stride[1] = 2;
  EXPECT_EQ(c.check(), "gate must be unit column stride, got stride 2");
  c = Call();
  c.a.gate.data = addr(0x1000000 + 2 * 1281);
  EXPECT_EQ(c.check(), "gate must be 16-byte aligned, got address 0x1000a02");
  c = Call();
  c.a.out.device = 2;
  EXPECT_EQ(c.check(), "out must be on cuda:0, got cuda:2");
  c = Call();
  c.a.q.device = -1;
  EXPECT_EQ(c.check(), "q must be on a CUDA device, got host memory");
  c = Call();
  c.a.out = TensorRef{};
  EXPECT_EQ(c.check(), "out is missing (null data)");
}

TEST(Attn2Check, WorkspaceAndOverlapReasons) {
  Call c;
  c.a.workspace = TensorRef{};
  EXPECT_EQ(c.check(), "workspace is missing (null data)");
  c = Call();
  c.a.workspace = md::make_tensor(addr(0x5000000), DType::kInt32, {1000});
  EXPECT_EQ(c.check(),
            "workspace must be at least 236800 bytes (attn2_workspace_bytes(1, 2, 7)), got 4000 bytes");
  c = Call();
  c.a.workspace.device = -1;
  EXPECT_EQ(c.check(), "workspace must be on a CUDA device, got host memory");
  c = Call();
  c.a.workspace.data = addr(0x5000004);
  EXPECT_EQ(c.check(), "workspace must be 16-byte aligned, got address 0x5000004");
  c = Call();
  c.a.out.data = c.a.q.data;
  EXPECT_EQ(c.check(), "out and q must not overlap in memory");
  c = Call();
  c.a.out.data = addr(0x10000000 + 4096);
  EXPECT_EQ(c.check(), "out and kv_cache must not overlap in memory");
  c = Call();
  c.a.out.data = addr(0x3000000);
  EXPECT_EQ(c.check(), "out and seq_lens must not overlap in memory");
  c = Call();
  c.a.workspace.data = addr(0x4000000 + 1024);
  EXPECT_EQ(c.check(), "out and workspace must not overlap in memory");
  c = Call();
  c.a.workspace.data = addr(0x2000000);
  EXPECT_EQ(c.check(), "workspace and block_table must not overlap in memory");
}

// ---- devices -------------------------------------------------------------------------

namespace {
Call on_unprepared_device() {
  Call c;
  for (TensorRef* t : {&c.a.q, &c.a.gate, &c.a.kv_cache, &c.a.block_table, &c.a.seq_lens, &c.a.out, &c.a.workspace})
    t->device = kUnpreparedDevice;
  return c;
}
}  // namespace

TEST(Attn2Device, TheOpNeedsPrepareFirst) {
  Call c = on_unprepared_device();
  EXPECT_EQ(c.check(), "(no error)");  // the arguments are good: only the device is missing
  EXPECT_EQ(error_of([&] { md::attn2(c.a, nullptr); }), "attn2 on cuda:63 needs prepare_attn2(63) first");
  EXPECT_EQ(error_of([] { md::attn2_residency(kUnpreparedDevice); }),
            "attn2_residency(63) needs prepare_attn2(63) first");
  // A bad argument is refused first, with its own text.
  c.a.q.dtype = DType::kFloat32;
  EXPECT_EQ(error_of([&] { md::attn2(c.a, nullptr); }), "q must be bfloat16, got float32");
}

TEST(Attn2Device, PrepareRefusesADeviceTheKernelsCannotRun) {
  EXPECT_EQ(error_of([] { md::prepare_attn2(kUnpreparedDevice); }), prepare_refusal("attn2", kUnpreparedDevice));
}

TEST(Attn2Device, TheBoundFormChecksItsTensorsThenPrepares) {
  const Call c = on_unprepared_device();
  const auto bind = [&](TensorRef kv, TensorRef ws, int mml, int window, int splits) {
    return error_of([&] { md::Attn2 op(kv, ws, mml, window, splits); });
  };
  const md::Attn2Args& a = c.a;
  EXPECT_EQ(bind(a.kv_cache, a.workspace, 4, 0, 1), "max_model_len must be at least 8, got 4");
  EXPECT_EQ(bind(a.kv_cache, a.workspace, a.max_model_len, 0, 33), "num_splits must be in [1, 32], got 33");
  TensorRef kv = a.kv_cache;
  kv.dtype = DType::kFloat16;
  EXPECT_EQ(bind(kv, a.workspace, a.max_model_len, 0, a.num_splits), "kv_cache must be bfloat16, got float16");
  EXPECT_EQ(bind(a.kv_cache, TensorRef{}, a.max_model_len, 0, a.num_splits), "workspace is missing (null data)");
  TensorRef ws = a.workspace;
  ws.device = 0;
  EXPECT_EQ(bind(a.kv_cache, ws, a.max_model_len, 0, a.num_splits), "workspace must be on cuda:63, got cuda:0");
  EXPECT_EQ(bind(a.kv_cache, a.workspace, a.max_model_len, 0, a.num_splits),
            prepare_refusal("attn2", kUnpreparedDevice));
  EXPECT_EQ(bind(a.kv_cache, TensorRef{}, 2048, 0, 1), prepare_refusal("attn2", kUnpreparedDevice));
}

// ---- the reference against closed forms -----------------------------------------------

namespace {

// A host problem: contiguous pages unless `pages` says otherwise.
struct HostProblem {
  int kvh, reqs, max_pages;
  std::vector<uint16_t> q, gate, cache;
  std::vector<int32_t> table, lens;
  HostProblem(int kvh_, std::vector<int> lens_, int max_pages_) : kvh(kvh_), reqs(int(lens_.size())), max_pages(max_pages_) {
    lens.assign(lens_.begin(), lens_.end());
    const int64_t width = 8 * kvh * 64;
    q.assign(reqs * 8 * width, 0);
    gate.assign(reqs * 8 * width, 0);
    table.assign(reqs * max_pages, -1);
    int next = 0;
    for (int r = 0; r < reqs; ++r)
      for (int pg = 0; pg < (lens[r] + 15) / 16; ++pg) table[r * max_pages + pg] = next++;
    cache.assign(int64_t(next) * kvh * 16 * 128, 0);
  }
  uint16_t* key(int r, int kv, int j) {
    const int64_t page = table[r * max_pages + j / 16];
    return &cache[((page * kvh + kv) * 16 + j % 16) * 128];
  }
  md::reference::Attn2Inputs inputs(int window) const {
    md::reference::Attn2Inputs in;
    in.q = q.data();
    in.q_stride = 8 * kvh * 64;
    in.gate = gate.data();
    in.gate_stride = 8 * kvh * 64;
    in.kv_cache = cache.data();
    in.num_kv_heads = kvh;
    in.block_table = table.data();
    in.block_table_stride = max_pages;
    in.seq_lens = lens.data();
    in.window = window;
    return in;
  }
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST(Attn2Reference, ZeroQueryAveragesTheVisibleValues) {
  // q = 0: every visible key has the same score, so o is the mean of the
  // visible V rows; V[j][d] = j + (d % 2) / 2 makes the mean (lo + p) / 2 + (d % 2) / 2.
  for (int window : {0, 3, 20}) {
    HostProblem h(2, {40, 8}, 4);
    for (int r = 0; r < 2; ++r)
      for (int kv = 0; kv < 2; ++kv)
        for (int j = 0; j < h.lens[r]; ++j)
          for (int d = 0; d < 64; ++d) {
            h.key(r, kv, j)[d] = bf16_bits(float(d % 5) - 2.0f);      // K: irrelevant
            h.key(r, kv, j)[64 + d] = bf16_bits(float(j) + (d % 2) * 0.5f);  // exact in bf16
          }
    for (auto& g : h.gate) g = bf16_bits(0.5f);
    std::vector<double> out(2 * 8 * 1024);
    md::reference::attn2(h.inputs(window), 2, out.data(), 1024);
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 8; ++i) {
        const int pos = h.lens[r] - 8 + i;
        const int lo = window ? std::max(0, pos - window + 1) : 0;
        double o[64], ms = 0;
        for (int d = 0; d < 64; ++d) {
          o[d] = (lo + pos) / 2.0 + (d % 2) * 0.5;
          ms += o[d] * o[d];
        }
        const double rms = 1.0 / std::sqrt(ms / 64 + 1e-5);
        for (int h2 = 0; h2 < 16; ++h2)
          for (int d = 0; d < 64; ++d)
            ASSERT_NEAR(out[(r * 8 + i) * 1024 + h2 * 64 + d], sigmoid(0.5) * o[d] * rms, 1e-12)
                << "window " << window << " r " << r << " i " << i;
      }
  }
}

TEST(Attn2Reference, WindowOfOneKeyCopiesItsValue) {
  HostProblem h(1, {33}, 3);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : h.cache) v = bf16_bits(n(rng));
  for (auto& v : h.q) v = bf16_bits(n(rng));
  for (auto& v : h.gate) v = bf16_bits(n(rng));
  std::vector<double> out(8 * 512);
  md::reference::attn2(h.inputs(1), 1, out.data(), 512);
  for (int i = 0; i < 8; ++i) {
    const uint16_t* v = h.key(0, 0, 25 + i) + 64;
    double ms = 0;
    for (int d = 0; d < 64; ++d) ms += md::reference::attn2_bf16_value(v[d]) * md::reference::attn2_bf16_value(v[d]);
    const double rms = 1.0 / std::sqrt(ms / 64 + 1e-5);
    for (int g = 0; g < 8; ++g)
      for (int d = 0; d < 64; ++d) {
        const double gv = md::reference::attn2_bf16_value(h.gate[i * 512 + g * 64 + d]);
        ASSERT_NEAR(out[i * 512 + g * 64 + d], sigmoid(gv) * md::reference::attn2_bf16_value(v[d]) * rms, 1e-12);
      }
  }
}

TEST(Attn2Reference, SoftmaxOfTwoKeysAndPageIndirection) {
  // L = 9: row 0 sees keys 0..1. With K_0 = e_0 and K_1 = 0 and q = c e_0,
  // a_0 = 1 / (1 + exp(-scale c)).
  HostProblem h(1, {9}, 2);
  for (int d = 0; d < 64; ++d) {
    h.key(0, 0, 0)[d] = bf16_bits(d == 0 ? 1.0f : 0.0f);
    h.key(0, 0, 1)[d] = 0;
    h.key(0, 0, 0)[64 + d] = bf16_bits(d < 32 ? 1.0f : -1.0f);
    h.key(0, 0, 1)[64 + d] = bf16_bits(d < 32 ? 3.0f : 2.0f);
  }
  for (int g = 0; g < 8; ++g) h.q[0 * 512 + g * 64] = bf16_bits(float(g));
  std::vector<double> out(8 * 512);
  md::reference::attn2(h.inputs(0), 1, out.data(), 512);
  for (int g = 0; g < 8; ++g) {
    const double a0 = 1.0 / (1.0 + std::exp(-0.6841258107984375 * g));
    const double hi = a0 * 1 + (1 - a0) * 3, lo = a0 * -1 + (1 - a0) * 2;
    const double rms = 1.0 / std::sqrt((hi * hi + lo * lo) / 2 + 1e-5);
    EXPECT_NEAR(out[g * 64 + 0], 0.5 * hi * rms, 1e-12);
    EXPECT_NEAR(out[g * 64 + 63], 0.5 * lo * rms, 1e-12);
  }
  // The same keys behind another page id (NaN in the page no longer used) give the same answer.
  HostProblem s = h;
  s.cache.resize(2 * 16 * 128);
  for (int e = 0; e < 16 * 128; ++e) {
    s.cache[16 * 128 + e] = s.cache[e];
    s.cache[e] = 0x7FC0;  // NaN
  }
  s.table[0] = 1;
  std::vector<double> out2(8 * 512);
  md::reference::attn2(s.inputs(0), 1, out2.data(), 512);
  EXPECT_EQ(out, out2);
}
