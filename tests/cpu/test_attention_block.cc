// CPU tests of attention_block's host layer and reference: the KV-head
// support, the key slices and the workspace layout, every refusal reason of
// the layer and call checks (exact text, the same from
// unsupported_attention_block_call, check_attention_block and the op), the
// launch parameters, the op and the bound form refusing a device not
// prepared, and the reference against the three ops' references chained by
// hand.
#include <gtest/gtest.h>

#include "check_util.h"
#include "random_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_block/params.h"
#include "muse_decode/arch.h"
#include "muse_decode/attention_block.h"
#include "muse_decode/reference.h"
#include "qkv_front/params.h"

namespace md = muse_decode;
namespace impl = muse_decode::attention_block_impl;
using md::DType;
using md::TensorRef;

namespace {

using muse_decode::testing::addr;
using muse_decode::testing::error_of;
using muse_decode::testing::kUnpreparedDevice;
using muse_decode::testing::prepare_refusal;

// A valid TP8 call (2 KV heads) of 2 requests (16 rows) on a full layer of
// max_model_len 32k; every tensor at its own fake address, none overlapping.
struct Call {
  int kvh = 2;
  int max_model_len = 32768;
  int window = 0;
  TensorRef x = md::make_tensor(addr(0x100000), DType::kBFloat16, {16, 8192});
  TensorRef qkv_weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2304, 8192});
  TensorRef positions = md::make_tensor(addr(0x20000000), DType::kInt64, {16});
  TensorRef cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 64});
  TensorRef slots = md::make_tensor(addr(0x22000000), DType::kInt64, {16});
  TensorRef cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 2, 16, 128});
  TensorRef block_table = md::make_tensor(addr(0x24000000), DType::kInt32, {2, 2048});
  TensorRef seq_lens = md::make_tensor(addr(0x25000000), DType::kInt32, {2});
  TensorRef o_proj_weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {8192, 1024});
  TensorRef out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {16, 8192});
  TensorRef workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {8 << 20});

  md::AttentionBlockArgs args(bool with_out = true) const {
    md::AttentionBlockArgs a;
    a.x = x;
    a.qkv_weight = qkv_weight;
    a.positions = positions;
    a.cos_sin = cos_sin;
    a.slot_mapping = slots;
    a.kv_cache = cache;
    a.num_kv_heads = kvh;
    a.block_table = block_table;
    a.seq_lens = seq_lens;
    a.max_model_len = max_model_len;
    a.window = window;
    a.o_proj_weight = o_proj_weight;
    if (with_out) {
      a.out = out;
      a.workspace = workspace;
    }
    return a;
  }
  // unsupported_attention_block_call, without out and workspace unless with_out.
  std::optional<std::string> why(bool with_out = true) const {
    return md::unsupported_attention_block_call(args(with_out));
  }
  // The text the checked op throws, after checking that check_attention_block
  // and params_of throw the same.
  std::string checked() const {
    const std::string thrown = error_of([&] { md::attention_block(args(), nullptr); });
    if (thrown.find("needs prepare_attention_block") == std::string::npos) {
      EXPECT_EQ(error_of([&] { md::check_attention_block(args()); }), thrown);
      EXPECT_EQ(error_of([&] { impl::params_of(args(), 132); }), thrown);
    }
    return thrown;
  }
};

// Sets R requests (8 R rows) on a call: x, positions, slots, out, the table and the lengths.
void set_requests(Call& c, int reqs) {
  const int64_t T = int64_t{reqs} * 8;
  c.x = md::make_tensor(addr(0x100000), DType::kBFloat16, {T, 8192});
  c.positions = md::make_tensor(addr(0x20000000), DType::kInt64, {T});
  c.slots = md::make_tensor(addr(0x22000000), DType::kInt64, {T});
  c.block_table = md::make_tensor(addr(0x24000000), DType::kInt32, {reqs, 2048});
  c.seq_lens = md::make_tensor(addr(0x25000000), DType::kInt32, {reqs});
  c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {T, 8192});
}

}  // namespace

// ---------------------------------------------------------------------------
// Sizing.

TEST(AttentionBlockSizing, KvHeads) {
  EXPECT_TRUE(md::attention_block_supports_kv_heads(2));
  EXPECT_TRUE(md::attention_block_supports_kv_heads(4));
  for (int kvh : {-2, 0, 1, 3, 5, 8, 16, 32}) EXPECT_FALSE(md::attention_block_supports_kv_heads(kvh)) << kvh;
  EXPECT_EQ(md::kAttentionBlockShares, impl::kShares);
}

TEST(AttentionBlockSizing, Splits) {
  // TP8, one request, full 32k: 132 / 2 = 66 shares per KV head, 256 groups.
  EXPECT_EQ(md::attention_block_splits(1, 2, 32768, 0), 66);
  // Sliding 2048 at 32k: 2055 keys, 129 pages, 17 groups.
  EXPECT_EQ(md::attention_block_splits(1, 2, 32768, 2048), 17);
  // max_model_len 2048: 128 pages, 16 groups.
  EXPECT_EQ(md::attention_block_splits(1, 2, 2048, 0), 16);
  EXPECT_EQ(md::attention_block_splits(1, 2, 131072, 0), 66);
  EXPECT_EQ(md::attention_block_splits(2, 2, 32768, 0), 33);
  EXPECT_EQ(md::attention_block_splits(3, 2, 32768, 0), 22);
  EXPECT_EQ(md::attention_block_splits(1, 4, 32768, 0), 33);
  EXPECT_EQ(md::attention_block_splits(8, 4, 131072, 0), 4);  // 132 / 32
  EXPECT_EQ(md::attention_block_splits(8, 2, 32768, 2048), 8);
  // Short rows: one slice per 8-page group, one at least.
  EXPECT_EQ(md::attention_block_splits(1, 2, 8, 0), 1);
  EXPECT_EQ(md::attention_block_splits(1, 2, 128, 0), 1);   // 8 pages: one group
  EXPECT_EQ(md::attention_block_splits(1, 2, 129, 0), 2);   // 9 pages: two groups
  EXPECT_EQ(md::attention_block_splits(1, 2, 32768, 1), 1);  // 8 keys
  EXPECT_EQ(md::attention_block_splits(1, 2, 32768, 121), 1);  // 128 keys: 8 pages
  EXPECT_EQ(md::attention_block_splits(1, 2, 32768, 122), 2);  // 129 keys: 9 pages
  // A window past max_model_len's keys counts max_model_len's.
  EXPECT_EQ(md::attention_block_splits(1, 2, 2050, 2049), md::attention_block_splits(1, 2, 2050, 0));

  // Every deployment: at most the shares in all, at most one slice per group,
  // the checked and the unchecked form alike.
  for (int kvh : {2, 4})
    for (int reqs = 1; reqs <= 8; ++reqs)
      for (int mml : {8, 9, 127, 128, 129, 2047, 2048, 2049, 4096, 32768, 131072})
        for (int window : {0, 1, 7, 2048}) {
          if (window >= mml) continue;
          const int s = md::attention_block_splits(reqs, kvh, mml, window);
          const int64_t keys = window > 0 ? std::min(mml, window + 7) : mml;
          const int64_t groups = ((keys + 15) / 16 + 7) / 8;
          EXPECT_GE(s, 1);
          EXPECT_LE(s, groups) << reqs << " " << kvh << " " << mml << " " << window;
          EXPECT_LE(int64_t{s} * reqs * kvh, 132) << reqs << " " << kvh << " " << mml << " " << window;
          // Filled: either every share is dealt (to within one per pair) or every group has its slice.
          EXPECT_TRUE(s == groups || int64_t{s + 1} * reqs * kvh > 132) << reqs << " " << kvh << " " << mml;
          EXPECT_EQ(impl::splits_of(reqs, kvh, mml, window), s);
        }
  // The unchecked form never gives less than one slice.
  EXPECT_EQ(impl::splits_of(0, 2, 32768, 0), 132);
  EXPECT_EQ(impl::splits_of(100, 4, 32768, 0), 1);
  EXPECT_EQ(impl::splits_of(1, 2, 0, 0), 1);
}

TEST(AttentionBlockSizing, SizingChecksEveryArgument) {
  const struct {
    int reqs, kvh, mml, window;
    const char* reason;
  } cases[] = {
      {0, 2, 32768, 0, "num_reqs must be in [1, 8], got 0"},
      {9, 2, 32768, 0, "num_reqs must be in [1, 8], got 9"},
      {-1, 2, 32768, 0, "num_reqs must be in [1, 8], got -1"},
      {1, 1, 32768, 0, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 1"},
      {1, 8, 32768, 0, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 8"},
      {1, 16, 32768, 0, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 16"},
      {1, 3, 32768, 0, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 3"},
      {1, 2, 7, 0, "max_model_len must be at least 8, got 7"},
      {1, 2, 32768, -1, "window must be 0 or in [1, max_model_len) (see attn2_window), got -1"},
      {1, 2, 32768, 32768, "window must be 0 or in [1, max_model_len) (see attn2_window), got 32768"},
      {1, 2, 2048, 4096, "window must be 0 or in [1, max_model_len) (see attn2_window), got 4096"},
  };
  for (const auto& k : cases) {
    EXPECT_EQ(error_of([&] { md::attention_block_splits(k.reqs, k.kvh, k.mml, k.window); }), k.reason);
    EXPECT_EQ(error_of([&] { md::attention_block_workspace_bytes(k.reqs, k.kvh, k.mml, k.window); }), k.reason);
  }
}

TEST(AttentionBlockSizing, WorkspaceLayout) {
  // TP8, one request, 66 slices: the counters (4 KB); one token group of the
  // front (36 tiles: 256 bytes of counters, then 36 + 132 partials of 4 KB);
  // the projection's 8 rows of 2304; 2 * 66 slices of 64 rows x 66 floats;
  // attention's 8 rows of 1024.
  const impl::WorkspaceLayout a = impl::workspace_layout(1, 2, 66);
  EXPECT_EQ(a.counters, 0);
  EXPECT_EQ(a.front, 4096);
  EXPECT_EQ(a.front_group_bytes, 256 + (36 + 132) * 4096);
  EXPECT_EQ(a.qkv, 4096 + 688384);
  EXPECT_EQ(a.attn_part, 692480 + 8 * 2304 * 2);
  EXPECT_EQ(a.attn_out, 729344 + 2 * 66 * 64 * 66 * 4);
  EXPECT_EQ(a.total, 2959616 + 8 * 1024 * 2);
  EXPECT_EQ(md::attention_block_workspace_bytes(1, 2, 32768, 0), 2976000);
  // TP4, 8 requests, 4 slices: 4 token groups of 72 tiles (512 bytes of counters).
  const impl::WorkspaceLayout b = impl::workspace_layout(8, 4, 4);
  EXPECT_EQ(b.front_group_bytes, 512 + (72 + 132) * 4096);
  EXPECT_EQ(b.qkv, 4096 + 4 * 836096);
  EXPECT_EQ(b.attn_part, 3348480 + 64 * 4608 * 2);
  EXPECT_EQ(b.attn_out, 3938304 + 8 * 4 * 4 * 64 * 66 * 4);
  EXPECT_EQ(b.total, 6100992 + 64 * 2048 * 2);

  for (int kvh : {2, 4}) {
    // A group's merge is qkv_front's workspace for 132 CTAs (its partials at
    // tile + share for share < 132), with one partial to spare.
    EXPECT_EQ(impl::workspace_layout(1, kvh, 1).front_group_bytes,
              md::qkv_front_workspace_bytes(kvh, impl::kShares) + md::qkv_front_impl::kFrontPartialBytes);
    for (int reqs = 1; reqs <= 8; ++reqs)
      for (int splits : {1, 2, 7, 16, 33, 66}) {
        const impl::WorkspaceLayout w = impl::workspace_layout(reqs, kvh, splits);
        const int64_t T = 8 * reqs, N = md::qkv_width(kvh), K = md::o_proj_in_width(kvh);
        const int64_t parts[] = {w.counters, w.front, w.qkv, w.attn_part, w.attn_out};
        for (int64_t p : parts) EXPECT_EQ(p % 256, 0) << reqs << " " << kvh << " " << splits;
        // In order, each part's bytes before the next starts.
        EXPECT_GE(w.front, w.counters + impl::kCounterWords * 4);
        EXPECT_GE(w.qkv, w.front + (T + 15) / 16 * w.front_group_bytes);
        EXPECT_GE(w.attn_part, w.qkv + T * N * 2);
        EXPECT_GE(w.attn_out, w.attn_part + int64_t{reqs} * kvh * splits * 64 * 66 * 4);
        EXPECT_EQ(w.total, w.attn_out + T * K * 2);
        EXPECT_LT(w.attn_out - w.attn_part - int64_t{reqs} * kvh * splits * 64 * 66 * 4, 256);
        // More slices, a larger workspace; the same front.
        const impl::WorkspaceLayout more = impl::workspace_layout(reqs, kvh, splits + 1);
        EXPECT_GT(more.total, w.total);
        EXPECT_EQ(more.attn_part, w.attn_part);
      }
  }
}

// The workspace a call needs grows with the deployment: a workspace sized for
// max_reqs (and max_model_len) serves every smaller step, although the layout
// of R requests alone shrinks from 3 to 4 requests at TP8 (22 slices each
// against 16).
TEST(AttentionBlockSizing, WorkspaceBytesServeEverySmallerStep) {
  EXPECT_GT(impl::workspace_layout(3, 2, 22).total, impl::workspace_layout(4, 2, 16).total);
  for (int kvh : {2, 4})
    for (int mml : {8, 2048, 4096, 32768, 131072})
      for (int window : {0, 2048}) {
        if (window >= mml) continue;
        int64_t previous = 0;
        for (int reqs = 1; reqs <= 8; ++reqs) {
          const int64_t bytes = md::attention_block_workspace_bytes(reqs, kvh, mml, window);
          EXPECT_GE(bytes, previous) << reqs << " " << kvh << " " << mml << " " << window;
          const int s = md::attention_block_splits(reqs, kvh, mml, window);
          EXPECT_GE(bytes, impl::workspace_layout(reqs, kvh, s).total);
          previous = bytes;
        }
      }
  for (int kvh : {2, 4})
    for (int reqs = 1; reqs <= 8; ++reqs) {
      int64_t previous = 0;
      for (int mml : {8, 100, 2048, 2049, 4096, 32768, 131072}) {
        const int64_t bytes = md::attention_block_workspace_bytes(reqs, kvh, mml, 0);
        EXPECT_GE(bytes, previous) << reqs << " " << kvh << " " << mml;
        previous = bytes;
      }
    }
}

// ---------------------------------------------------------------------------
// The layer.

namespace {
md::AttentionBlockLayer good_layer(int kvh = 2) {
  md::AttentionBlockLayer l;
  const int heads = 8 * kvh;
  l.projection.num_heads = heads;
  l.projection.num_kv_heads = kvh;
  l.projection.tp_size = 16 / kvh;
  l.projection.weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {md::qkv_width(kvh), 8192});
  l.projection.use_rope = true;
  l.projection.rotary.present = true;
  l.projection.rotary.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 64});
  l.attention.num_heads = heads;
  l.attention.num_kv_heads = kvh;
  l.output.num_heads = heads;
  l.output.tp_size = 16 / kvh;
  l.output.weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {8192, md::o_proj_in_width(kvh)});
  l.num_kv_heads = kvh;
  l.max_model_len = 32768;
  l.max_reqs = 8;
  l.sliding_window = 2048;
  return l;
}
}  // namespace

TEST(AttentionBlockLayer, Supported) {
  EXPECT_EQ(md::unsupported_attention_block(good_layer(2)), std::nullopt);
  EXPECT_EQ(md::unsupported_attention_block(good_layer(4)), std::nullopt);
  auto l = good_layer();
  l.sliding_window = std::nullopt;  // a full layer
  l.projection.use_rope = false;
  l.projection.rotary = md::RotaryDesc{};
  EXPECT_EQ(md::unsupported_attention_block(l), std::nullopt);
  l = good_layer();
  l.sliding_window = 40000;  // covers max_model_len: no window
  l.max_reqs = 1;
  l.max_model_len = 8;
  EXPECT_EQ(md::unsupported_attention_block(l), std::nullopt);
}

// The three ops' own reasons first, in the order of the chain, their text unchanged.
TEST(AttentionBlockLayer, TheOpsReasonsComeFirst) {
  auto l = good_layer();
  l.projection.quantized = true;
  l.attention.use_o_gate = false;
  l.output.has_bias = true;
  l.num_kv_heads = 8;
  EXPECT_EQ(md::unsupported_attention_block(l), md::unsupported_projection(l.projection));
  EXPECT_EQ(*md::unsupported_attention_block(l),
            "a quantized QKV projection (the front reads an unquantized bf16 weight)");
  l.projection.quantized = false;
  EXPECT_EQ(*md::unsupported_attention_block(l), "the layer has no o-norm with a sigmoid o-gate");
  l.attention.use_o_gate = true;
  EXPECT_EQ(*md::unsupported_attention_block(l), "an output projection with a bias (o_proj adds none)");
  l.output.has_bias = false;
  EXPECT_EQ(*md::unsupported_attention_block(l), "8 KV heads per rank (the block serves 2 or 4: TP8 or TP4)");

  l = good_layer();
  l.projection.rotary.is_neox_style = true;
  EXPECT_EQ(*md::unsupported_attention_block(l), "a neox-style rotary table (the front rotates interleaved pairs)");
  l = good_layer();
  l.attention.scaling = 0.125;
  EXPECT_EQ(*md::unsupported_attention_block(l), "softmax scale 0.125 (the kernel is built for 0.6841258107984375)");
  l = good_layer();
  l.output.weight.dtype = DType::kFloat16;
  EXPECT_EQ(*md::unsupported_attention_block(l), "a float16 output-projection weight (o_proj reads bfloat16)");
}

TEST(AttentionBlockLayer, TheBlocksOwnReasons) {
  // Ranks the three ops serve and the block does not: TP16 and TP2.
  EXPECT_EQ(*md::unsupported_attention_block(good_layer(1)),
            "1 KV heads per rank (the block serves 2 or 4: TP8 or TP4)");
  EXPECT_EQ(*md::unsupported_attention_block(good_layer(8)),
            "8 KV heads per rank (the block serves 2 or 4: TP8 or TP4)");
  EXPECT_EQ(*md::unsupported_attention_block(good_layer(16)),
            "16 KV heads per rank (the block serves 2 or 4: TP8 or TP4)");
  // The three descriptions of one rank.
  auto l = good_layer(4);
  l.projection = good_layer(2).projection;
  EXPECT_EQ(*md::unsupported_attention_block(l), "a QKV projection of 2 KV heads on a rank of 4");
  l = good_layer(4);
  l.attention = good_layer(2).attention;
  EXPECT_EQ(*md::unsupported_attention_block(l), "an attention of 2 KV heads on a rank of 4");
  l = good_layer(4);
  l.output = good_layer(2).output;
  EXPECT_EQ(*md::unsupported_attention_block(l),
            "an output projection of 16 query heads on a rank of 4 KV heads (the block needs 32)");
  // The deployment.
  for (int reqs : {0, 9, -1}) {
    l = good_layer();
    l.max_reqs = reqs;
    EXPECT_EQ(*md::unsupported_attention_block(l),
              "max_reqs " + std::to_string(reqs) + " (the block serves 1 to 8 requests)");
  }
  l = good_layer();
  l.max_model_len = 7;
  EXPECT_EQ(*md::unsupported_attention_block(l), "max_model_len 7 (the block needs at least 8, one verify step)");
  // The window as attn2_window takes it.
  for (int w : {0, -5}) {
    l = good_layer();
    l.sliding_window = w;
    EXPECT_EQ(*md::unsupported_attention_block(l),
              "sliding_window must be at least 1 (or none), got " + std::to_string(w));
    EXPECT_EQ(*md::unsupported_attention_block(l), error_of([&] { md::attn2_window(w, 32768); }));
  }
}

// ---------------------------------------------------------------------------
// Per-call checks.

TEST(AttentionBlockChecks, ValidCallFillsTheParams) {
  Call c;
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_TRUE(md::attention_block_supports_call(c.args(false)));
  EXPECT_TRUE(md::attention_block_supports_call(c.args()));
  EXPECT_NO_THROW(md::check_attention_block(c.args()));
  const impl::Params p = impl::params_of(c.args(), 132);
  EXPECT_EQ(p.x, c.x.data);
  EXPECT_EQ(p.x_stride, 8192);
  EXPECT_EQ(p.qkv_weight, c.qkv_weight.data);
  EXPECT_EQ(p.positions, c.positions.data);
  EXPECT_EQ(p.cos_sin, c.cos_sin.data);
  EXPECT_EQ(p.max_pos, 4096);
  EXPECT_EQ(p.slot_mapping, c.slots.data);
  EXPECT_EQ(p.kv_cache, c.cache.data);
  EXPECT_EQ(p.num_pages, 64);
  EXPECT_EQ(p.block_table, c.block_table.data);
  EXPECT_EQ(p.block_table_stride, 2048);
  EXPECT_EQ(p.seq_lens, c.seq_lens.data);
  EXPECT_EQ(p.o_weight, c.o_proj_weight.data);
  EXPECT_EQ(p.out, c.out.data);
  EXPECT_EQ(p.out_stride, 8192);
  EXPECT_EQ(p.workspace, c.workspace.data);
  EXPECT_EQ(p.num_reqs, 2);
  EXPECT_EQ(p.num_kv_heads, 2);
  EXPECT_EQ(p.max_model_len, 32768);
  EXPECT_EQ(p.window, 0);
  EXPECT_EQ(p.num_splits, 33);
  EXPECT_EQ(p.grid, 132);
  EXPECT_EQ(impl::params_of(c.args(), 78).grid, 78);
  EXPECT_EQ(impl::params_of(c.args(), 1).grid, 1);

  // A NoPE layer; a sliding layer; strided rows of x, out and the table.
  c.cos_sin = TensorRef{};
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(impl::params_of(c.args(), 132).cos_sin, nullptr);
  EXPECT_EQ(impl::params_of(c.args(), 132).max_pos, 0);
  c = Call{};
  c.window = 2048;
  c.x.stride[0] = 8192 + 64;
  c.out.stride[0] = 3 * 8192;
  c.block_table = md::make_tensor(addr(0x24000000), DType::kInt32, {2, 4096});
  c.block_table.shape[1] = 2050;  // a column slice of a wider table
  const impl::Params q = impl::params_of(c.args(), 132);
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(q.window, 2048);
  EXPECT_EQ(q.num_splits, 17);
  EXPECT_EQ(q.x_stride, 8192 + 64);
  EXPECT_EQ(q.out_stride, 3 * 8192);
  EXPECT_EQ(q.block_table_stride, 4096);

  // 1 and 8 requests, TP4; a workspace of any dtype, counted in bytes.
  for (int kvh : {2, 4})
    for (int reqs : {1, 3, 8}) {
      Call k;
      set_requests(k, reqs);
      k.kvh = kvh;
      k.qkv_weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {md::qkv_width(kvh), 8192});
      k.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, kvh, 16, 128});
      k.o_proj_weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {8192, md::o_proj_in_width(kvh)});
      const int64_t need = md::attention_block_workspace_bytes(reqs, kvh, 32768, 0);
      k.workspace = md::make_tensor(addr(0x40000000), DType::kInt32, {need / 4});
      EXPECT_EQ(k.why(), std::nullopt) << kvh << " " << reqs;
      const impl::Params pk = impl::params_of(k.args(), 132);
      EXPECT_EQ(pk.num_reqs, reqs);
      EXPECT_EQ(pk.num_kv_heads, kvh);
      EXPECT_EQ(pk.num_splits, md::attention_block_splits(reqs, kvh, 32768, 0));
      EXPECT_EQ(pk.block_table_stride, 2048);
      k.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {need - 1});
      EXPECT_NE(k.why(), std::nullopt) << kvh << " " << reqs;
    }
}

TEST(AttentionBlockChecks, UnsupportedCallReasons) {
  struct Case {
    const char* what;
    void (*edit)(Call&);
    const char* reason;
  };
  const char* x_shape = "x must be [R*8, 8192] with 1 <= R <= 8 (8 rows per request), got ";
  const Case cases[] = {
      // x
      {"x absent", [](Call& c) { c.x = TensorRef{}; }, "x is missing (null data)"},
      {"x dtype", [](Call& c) { c.x.dtype = DType::kFloat16; }, "x must be bfloat16, got float16"},
      {"x host", [](Call& c) { c.x.device = -1; }, "x must be on a CUDA device, got host memory"},
      {"x column stride", [](Call& c) { c.x.stride[1] = 2; }, "x must be unit stride along columns, got stride 2"},
      {"x misaligned rows", [](Call& c) { c.x.stride[0] = 8196; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 8196"},
      {"x overlapping rows", [](Call& c) { c.x.stride[0] = 4096; },
       "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 4096"},
      {"x misaligned base", [](Call& c) { c.x.data = addr(0x100008); },
       "x must be 16-byte aligned, got address 0x100008"},
      // num_kv_heads
      {"num_kv_heads 1", [](Call& c) { c.kvh = 1; }, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 1"},
      {"num_kv_heads 8", [](Call& c) { c.kvh = 8; }, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 8"},
      {"num_kv_heads 16", [](Call& c) { c.kvh = 16; }, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 16"},
      {"num_kv_heads 0", [](Call& c) { c.kvh = 0; }, "num_kv_heads must be 2 or 4 (TP8 or TP4), got 0"},
      // qkv_weight
      {"qkv_weight absent", [](Call& c) { c.qkv_weight = TensorRef{}; }, "qkv_weight is missing (null data)"},
      {"qkv_weight dtype", [](Call& c) { c.qkv_weight.dtype = DType::kFloat32; },
       "qkv_weight must be bfloat16, got float32"},
      {"qkv_weight device", [](Call& c) { c.qkv_weight.device = 1; }, "qkv_weight must be on cuda:0, got cuda:1"},
      {"qkv_weight of another N",
       [](Call& c) { c.qkv_weight = md::make_tensor(addr(0x10000000), DType::kBFloat16, {2560, 8192}); },
       "qkv_weight must be [2304, 8192] for 2 KV heads, got [2560, 8192]"},
      {"KVH that does not fit the weight", [](Call& c) { c.kvh = 4; },
       "qkv_weight must be [4608, 8192] for 4 KV heads, got [2304, 8192]"},
      {"qkv_weight strided", [](Call& c) { c.qkv_weight.stride[0] = 8200; },
       "qkv_weight must be contiguous, got strides [8200, 1]"},
      {"qkv_weight misaligned", [](Call& c) { c.qkv_weight.data = addr(0x10000002); },
       "qkv_weight must be 16-byte aligned, got address 0x10000002"},
      // positions, cos_sin, slot_mapping
      {"positions absent", [](Call& c) { c.positions = TensorRef{}; }, "positions is missing (null data)"},
      {"positions dtype", [](Call& c) { c.positions.dtype = DType::kInt32; }, "positions must be int64, got int32"},
      {"positions device", [](Call& c) { c.positions.device = 2; }, "positions must be on cuda:0, got cuda:2"},
      {"positions length",
       [](Call& c) { c.positions = md::make_tensor(addr(0x20000000), DType::kInt64, {8}); },
       "positions must be a contiguous [16] (one per row of x), got [8]"},
      {"positions strided", [](Call& c) { c.positions.stride[0] = 2; },
       "positions must be a contiguous [16] (one per row of x), got [16] strided"},
      {"cos_sin dtype", [](Call& c) { c.cos_sin.dtype = DType::kBFloat16; }, "cos_sin must be float32, got bfloat16"},
      {"cos_sin width",
       [](Call& c) { c.cos_sin = md::make_tensor(addr(0x21000000), DType::kFloat32, {4096, 32}); },
       "cos_sin must be [max_pos, 64] with max_pos >= 1 (cos | sin), got [4096, 32]"},
      {"cos_sin strided", [](Call& c) { c.cos_sin.stride[0] = 128; },
       "cos_sin must be contiguous, got strides [128, 1]"},
      {"cos_sin host", [](Call& c) { c.cos_sin.device = -1; }, "cos_sin must be on a CUDA device, got host memory"},
      {"slot_mapping dtype", [](Call& c) { c.slots.dtype = DType::kInt32; }, "slot_mapping must be int64, got int32"},
      {"slot_mapping length",
       [](Call& c) { c.slots = md::make_tensor(addr(0x22000000), DType::kInt64, {17}); },
       "slot_mapping must be a contiguous [16] (one per row of x), got [17]"},
      // kv_cache
      {"kv_cache absent", [](Call& c) { c.cache = TensorRef{}; }, "kv_cache is missing (null data)"},
      {"kv_cache dtype", [](Call& c) { c.cache.dtype = DType::kFloat16; }, "kv_cache must be bfloat16, got float16"},
      {"kv_cache device", [](Call& c) { c.cache.device = 1; }, "kv_cache must be on cuda:0, got cuda:1"},
      {"kv_cache heads",
       [](Call& c) { c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 4, 16, 128}); },
       "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 4, 16, 128]"},
      {"kv_cache page size",
       [](Call& c) { c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 2, 32, 128}); },
       "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 2, 32, 128]"},
      {"kv_cache strided", [](Call& c) { c.cache.stride[0] = 8192; },
       "kv_cache must be contiguous, got strides [8192, 2048, 128, 1]"},
      {"kv_cache misaligned", [](Call& c) { c.cache.data = addr(0x23000004); },
       "kv_cache must be 16-byte aligned, got address 0x23000004"},
      {"kv_cache pages", [](Call& c) { c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16,
                                                                 {int64_t{1} << 31, 2, 16, 128}); },
       "kv_cache pages must be at most 2^31 - 1, got 2147483648"},
      // The deployment's scalars.
      {"max_model_len 7", [](Call& c) { c.max_model_len = 7; }, "max_model_len must be at least 8, got 7"},
      {"window negative", [](Call& c) { c.window = -1; },
       "window must be 0 or in [1, max_model_len) (see attn2_window), got -1"},
      {"window of max_model_len", [](Call& c) { c.window = 32768; },
       "window must be 0 or in [1, max_model_len) (see attn2_window), got 32768"},
      {"window past max_model_len", [](Call& c) { c.window = 40000; },
       "window must be 0 or in [1, max_model_len) (see attn2_window), got 40000"},
      // block_table, seq_lens
      {"block_table absent", [](Call& c) { c.block_table = TensorRef{}; }, "block_table is missing (null data)"},
      {"block_table dtype", [](Call& c) { c.block_table.dtype = DType::kInt64; },
       "block_table must be int32, got int64"},
      {"block_table device", [](Call& c) { c.block_table.device = 1; }, "block_table must be on cuda:0, got cuda:1"},
      {"block_table rows",
       [](Call& c) { c.block_table = md::make_tensor(addr(0x24000000), DType::kInt32, {1, 2048}); },
       "block_table must be [2, >= 2048] (R, ceil(max_model_len / 16)), got [1, 2048]"},
      {"block_table pages",
       [](Call& c) { c.block_table = md::make_tensor(addr(0x24000000), DType::kInt32, {2, 2047}); },
       "block_table must be [2, >= 2048] (R, ceil(max_model_len / 16)), got [2, 2047]"},
      {"block_table column stride", [](Call& c) { c.block_table.stride[1] = 2; },
       "block_table must be unit column stride, got stride 2"},
      {"block_table overlapping rows", [](Call& c) { c.block_table.stride[0] = 1024; },
       "block_table row stride must be at least 2048, got 1024"},
      {"block_table misaligned", [](Call& c) { c.block_table.data = addr(0x24000002); },
       "block_table must be 4-byte aligned, got address 0x24000002"},
      {"seq_lens absent", [](Call& c) { c.seq_lens = TensorRef{}; }, "seq_lens is missing (null data)"},
      {"seq_lens dtype", [](Call& c) { c.seq_lens.dtype = DType::kInt64; }, "seq_lens must be int32, got int64"},
      {"seq_lens host", [](Call& c) { c.seq_lens.device = -1; }, "seq_lens must be on a CUDA device, got host memory"},
      {"seq_lens length",
       [](Call& c) { c.seq_lens = md::make_tensor(addr(0x25000000), DType::kInt32, {1}); },
       "seq_lens must be a contiguous [2] (one per request: x's rows / 8), got [1]"},
      {"seq_lens strided", [](Call& c) { c.seq_lens.stride[0] = 4; },
       "seq_lens must be a contiguous [2] (one per request: x's rows / 8), got [2] strided"},
      {"seq_lens misaligned", [](Call& c) { c.seq_lens.data = addr(0x25000002); },
       "seq_lens must be 4-byte aligned, got address 0x25000002"},
      // o_proj_weight
      {"o_proj_weight absent", [](Call& c) { c.o_proj_weight = TensorRef{}; },
       "o_proj_weight is missing (null data)"},
      {"o_proj_weight dtype", [](Call& c) { c.o_proj_weight.dtype = DType::kFloat16; },
       "o_proj_weight must be bfloat16, got float16"},
      {"o_proj_weight device", [](Call& c) { c.o_proj_weight.device = 4; },
       "o_proj_weight must be on cuda:0, got cuda:4"},
      {"o_proj_weight of another K",
       [](Call& c) { c.o_proj_weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {8192, 2048}); },
       "o_proj_weight must be [8192, 1024] for 2 KV heads, got [8192, 2048]"},
      {"o_proj_weight transposed",
       [](Call& c) { c.o_proj_weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {1024, 8192}); },
       "o_proj_weight must be [8192, 1024] for 2 KV heads, got [1024, 8192]"},
      {"o_proj_weight strided", [](Call& c) { c.o_proj_weight.stride[0] = 1032; },
       "o_proj_weight must be contiguous, got strides [1032, 1]"},
      {"o_proj_weight misaligned", [](Call& c) { c.o_proj_weight.data = addr(0x28000008); },
       "o_proj_weight must be 16-byte aligned, got address 0x28000008"},
      // The cache is written: it must not alias what is read.
      {"kv_cache over x", [](Call& c) { c.cache.data = addr(0x100000 + 16 * 8192 * 2 - 16); },
       "kv_cache and x must not overlap in memory"},
      {"kv_cache over qkv_weight", [](Call& c) { c.cache.data = addr(0x10000000); },
       "kv_cache and qkv_weight must not overlap in memory"},
      {"kv_cache over cos_sin", [](Call& c) { c.cache.data = addr(0x21000000 + 4096 * 64 * 4 - 16); },
       "kv_cache and cos_sin must not overlap in memory"},
      {"kv_cache over block_table", [](Call& c) { c.cache.data = addr(0x24000000 - 16); },
       "kv_cache and block_table must not overlap in memory"},
      {"kv_cache over seq_lens", [](Call& c) { c.cache.data = addr(0x25000000); },
       "kv_cache and seq_lens must not overlap in memory"},
      {"kv_cache over o_proj_weight", [](Call& c) { c.cache.data = addr(0x28000000 + 1024); },
       "kv_cache and o_proj_weight must not overlap in memory"},
      // out
      {"out dtype", [](Call& c) { c.out.dtype = DType::kFloat32; }, "out must be bfloat16, got float32"},
      {"out host", [](Call& c) { c.out.device = -1; }, "out must be on a CUDA device, got host memory"},
      {"out device", [](Call& c) { c.out.device = 3; }, "out must be on cuda:0, got cuda:3"},
      {"out rows",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {8, 8192}); },
       "out must be [16, 8192] (rows of x, hidden size), got [8, 8192]"},
      {"out width",
       [](Call& c) { c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {16, 1024}); },
       "out must be [16, 8192] (rows of x, hidden size), got [16, 1024]"},
      {"out column stride", [](Call& c) { c.out.stride[1] = 8; },
       "out must be unit stride along columns, got stride 8"},
      {"out misaligned rows", [](Call& c) { c.out.stride[0] = 8196; },
       "out rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 8196"},
      {"out misaligned base", [](Call& c) { c.out.data = addr(0x30000004); },
       "out must be 16-byte aligned, got address 0x30000004"},
      {"out over x", [](Call& c) { c.out.data = addr(0x100000); }, "out and x must not overlap in memory"},
      {"out over qkv_weight", [](Call& c) { c.out.data = addr(0x10000000 + 2304 * 8192 * 2 - 16); },
       "out and qkv_weight must not overlap in memory"},
      {"out over positions", [](Call& c) { c.out.data = addr(0x20000000 - 16); },
       "out and positions must not overlap in memory"},
      {"out over slot_mapping", [](Call& c) { c.out.data = addr(0x22000000); },
       "out and slot_mapping must not overlap in memory"},
      {"out over block_table", [](Call& c) { c.out.data = addr(0x24000000 + 4096); },
       "out and block_table must not overlap in memory"},
      {"out over o_proj_weight", [](Call& c) { c.out.data = addr(0x28000000); },
       "out and o_proj_weight must not overlap in memory"},
      {"out over kv_cache", [](Call& c) { c.out.data = addr(0x23000000 + 64 * 2 * 16 * 128 * 2 - 16); },
       "out and kv_cache must not overlap in memory"},
      // workspace
      {"workspace host", [](Call& c) { c.workspace.device = -1; },
       "workspace must be on a CUDA device, got host memory"},
      {"workspace device", [](Call& c) { c.workspace.device = 1; }, "workspace must be on cuda:0, got cuda:1"},
      {"workspace small", [](Call& c) { c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {3029247}); },
       "workspace must be a contiguous 1-D buffer of at least 3029248 bytes (attention_block_workspace_bytes(2, 2, "
       "32768, 0)), got [3029247] of uint8, 3029247 bytes"},
      {"workspace small in floats",
       [](Call& c) { c.workspace = md::make_tensor(addr(0x40000000), DType::kFloat32, {1000}); },
       "workspace must be a contiguous 1-D buffer of at least 3029248 bytes (attention_block_workspace_bytes(2, 2, "
       "32768, 0)), got [1000] of float32, 4000 bytes"},
      {"workspace 2-D", [](Call& c) { c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {4096, 4096}); },
       "workspace must be a contiguous 1-D buffer of at least 3029248 bytes (attention_block_workspace_bytes(2, 2, "
       "32768, 0)), got [4096, 4096] of uint8, 16777216 bytes"},
      {"workspace strided", [](Call& c) { c.workspace.stride[0] = 2; },
       "workspace must be a contiguous 1-D buffer of at least 3029248 bytes (attention_block_workspace_bytes(2, 2, "
       "32768, 0)), got [8388608] of uint8 with strides [2]"},
      {"workspace misaligned", [](Call& c) { c.workspace.data = addr(0x40000008); },
       "workspace must be 16-byte aligned, got address 0x40000008"},
      {"workspace over x", [](Call& c) { c.workspace.data = addr(0x80000); },
       "workspace and x must not overlap in memory"},
      {"workspace over cos_sin", [](Call& c) { c.workspace.data = addr(0x21000000); },
       "workspace and cos_sin must not overlap in memory"},
      {"workspace over o_proj_weight", [](Call& c) { c.workspace.data = addr(0x28000000 + (16 << 20) - 16); },
       "workspace and o_proj_weight must not overlap in memory"},
      {"workspace over kv_cache", [](Call& c) { c.workspace.data = addr(0x22800010); },
       "workspace and kv_cache must not overlap in memory"},
      {"workspace over out", [](Call& c) { c.workspace.data = addr(0x30000000 + 16 * 8192 * 2 - 16); },
       "workspace and out must not overlap in memory"},
  };
  for (const Case& k : cases) {
    Call c;
    k.edit(c);
    const auto why = c.why();
    ASSERT_TRUE(why.has_value()) << k.what;
    EXPECT_EQ(*why, k.reason) << k.what;
    EXPECT_EQ(c.checked(), k.reason) << k.what << ": the checked call throws the same text";
  }
  // x's rows: R = 0, R = 9, rows that are not whole requests, another width.
  const TensorRef shapes[] = {
      md::make_tensor(addr(0x100000), DType::kBFloat16, {0, 8192}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {72, 8192}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {12, 8192}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {4, 8192}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {16, 4096}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {2, 8, 8192}),
      md::make_tensor(addr(0x100000), DType::kBFloat16, {131072})};
  const char* texts[] = {"[0, 8192]", "[72, 8192]", "[12, 8192]", "[4, 8192]", "[16, 4096]", "[2, 8, 8192]",
                         "[131072]"};
  for (int i = 0; i < 7; ++i) {
    Call c;
    c.x = shapes[i];
    EXPECT_EQ(c.why(), std::string(x_shape) + texts[i]);
    EXPECT_EQ(c.checked(), std::string(x_shape) + texts[i]);
  }
}

TEST(AttentionBlockChecks, OutAndWorkspaceMayBeAbsent) {
  // Without them their checks are skipped; the checked call needs both.
  Call c;
  c.out = md::make_tensor(addr(0x30000000), DType::kBFloat16, {16, 4096});
  c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {16});
  EXPECT_EQ(c.why(false), std::nullopt);
  EXPECT_TRUE(md::attention_block_supports_call(c.args(false)));
  EXPECT_FALSE(md::attention_block_supports_call(c.args()));
  EXPECT_EQ(c.why(), "out must be [16, 8192] (rows of x, hidden size), got [16, 4096]");
  c = Call{};
  c.out = TensorRef{};
  EXPECT_EQ(c.why(), std::nullopt);  // workspace given and checked, out absent and skipped
  EXPECT_EQ(c.checked(), "out is missing (null data)");
  c.workspace.device = 5;
  EXPECT_EQ(c.why(), "workspace must be on cuda:0, got cuda:5");
  c = Call{};
  c.workspace = TensorRef{};
  EXPECT_EQ(c.why(), std::nullopt);
  EXPECT_EQ(c.checked(), "workspace is missing (null data)");
  // Adjacent buffers do not overlap.
  c = Call{};
  c.out.data = addr(0x100000 + 16 * 8192 * 2);
  c.workspace.data = addr(0x30000000 + 16 * 8192 * 2);
  EXPECT_EQ(c.why(), std::nullopt);
}

TEST(AttentionBlockChecks, TheWorkspaceFollowsTheDeployment) {
  // Sized for a sliding layer, too small for a full one; sized for 8
  // requests, enough for every smaller step.
  Call c;
  c.window = 2048;
  const int64_t sliding = md::attention_block_workspace_bytes(2, 2, 32768, 2048);
  c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {sliding});
  EXPECT_EQ(c.why(), std::nullopt);
  c.window = 0;
  EXPECT_EQ(c.why(), "workspace must be a contiguous 1-D buffer of at least 3029248 bytes "
                     "(attention_block_workspace_bytes(2, 2, 32768, 0)), got [" + std::to_string(sliding) +
                         "] of uint8, " + std::to_string(sliding) + " bytes");
  const int64_t eight = md::attention_block_workspace_bytes(8, 2, 32768, 0);
  for (int reqs = 1; reqs <= 8; ++reqs) {
    Call k;
    set_requests(k, reqs);
    k.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {eight});
    EXPECT_EQ(k.why(), std::nullopt) << reqs;
  }
}

TEST(AttentionBlockChecks, GridOfTheParams) {
  Call c;
  EXPECT_EQ(error_of([&] { impl::params_of(c.args(), 0); }),
            "grid must be in [1, 132] (one CTA per SM, at most kAttentionBlockShares), got 0");
  EXPECT_EQ(error_of([&] { impl::params_of(c.args(), 133); }),
            "grid must be in [1, 132] (one CTA per SM, at most kAttentionBlockShares), got 133");
  c.x.dtype = DType::kFloat32;  // the arguments first
  EXPECT_EQ(error_of([&] { impl::params_of(c.args(), 0); }), "x must be bfloat16, got float32");
}

// ---------------------------------------------------------------------------
// Devices.

namespace {
Call on_unprepared_device() {
  Call c;
  for (TensorRef* t : {&c.x, &c.qkv_weight, &c.positions, &c.cos_sin, &c.slots, &c.cache, &c.block_table,
                       &c.seq_lens, &c.o_proj_weight, &c.out, &c.workspace})
    t->device = kUnpreparedDevice;
  return c;
}
}  // namespace

TEST(AttentionBlockDevice, TheOpNeedsPrepareFirst) {
  Call c = on_unprepared_device();
  EXPECT_EQ(c.why(), std::nullopt);  // the arguments are good: only the device is missing
  EXPECT_EQ(c.checked(), "attention_block on cuda:63 needs prepare_attention_block(63) first");
  c.seq_lens.dtype = DType::kInt64;  // a bad argument is refused first, with its own text
  EXPECT_EQ(c.checked(), "seq_lens must be int32, got int64");
}

TEST(AttentionBlockDevice, PrepareRefusesADeviceTheKernelCannotRun) {
  EXPECT_EQ(error_of([] { md::prepare_attention_block(kUnpreparedDevice); }),
            prepare_refusal("attention_block", kUnpreparedDevice));
  EXPECT_EQ(error_of([] { md::prepare_attention_block(-2); }),
            "device must be -1 (the current device) or an ordinal >= 0, got -2");
}

TEST(AttentionBlockDevice, TheBoundFormChecksItsTensorsThenPrepares) {
  struct Bind {
    Call c = on_unprepared_device();
    std::string operator()() const {
      return error_of([&] {
        md::AttentionBlock block(c.qkv_weight, c.cos_sin, c.cache, c.kvh, c.o_proj_weight, c.max_model_len,
                                 c.window, c.workspace);
      });
    }
  };
  Bind b;
  b.c.kvh = 8;
  EXPECT_EQ(b(), "num_kv_heads must be 2 or 4 (TP8 or TP4), got 8");
  b = Bind{};
  b.c.qkv_weight.dtype = DType::kFloat16;
  EXPECT_EQ(b(), "qkv_weight must be bfloat16, got float16");
  b = Bind{};
  b.c.qkv_weight.device = -1;
  EXPECT_EQ(b(), "qkv_weight must be on a CUDA device, got host memory");
  b = Bind{};
  b.c.cos_sin.device = 0;  // the QKV weight decides the device
  EXPECT_EQ(b(), "cos_sin must be on cuda:63, got cuda:0");
  b = Bind{};
  b.c.cache = md::make_tensor(addr(0x23000000), DType::kBFloat16, {64, 4, 16, 128}, kUnpreparedDevice);
  EXPECT_EQ(b(), "kv_cache must be [pages, 2, 16, 128] (num_kv_heads = 2), got [64, 4, 16, 128]");
  b = Bind{};
  b.c.o_proj_weight = md::make_tensor(addr(0x28000000), DType::kBFloat16, {8192, 2048}, kUnpreparedDevice);
  EXPECT_EQ(b(), "o_proj_weight must be [8192, 1024] for 2 KV heads, got [8192, 2048]");
  b = Bind{};
  b.c.max_model_len = 4;
  EXPECT_EQ(b(), "max_model_len must be at least 8, got 4");
  b = Bind{};
  b.c.window = 32768;
  EXPECT_EQ(b(), "window must be 0 or in [1, max_model_len) (see attn2_window), got 32768");
  b = Bind{};
  b.c.workspace = TensorRef{};
  EXPECT_EQ(b(), "workspace is missing (null data)");
  b = Bind{};
  b.c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8, {2975999}, kUnpreparedDevice);
  EXPECT_EQ(b(), "workspace must be a contiguous 1-D buffer of at least 2976000 bytes "
                 "(attention_block_workspace_bytes(1, 2, 32768, 0)), got [2975999] of uint8, 2975999 bytes");
  b = Bind{};
  b.c.cache.data = b.c.o_proj_weight.data;
  EXPECT_EQ(b(), "kv_cache and o_proj_weight must not overlap in memory");
  b = Bind{};
  b.c.workspace.data = b.c.cache.data;
  EXPECT_EQ(b(), "workspace and kv_cache must not overlap in memory");
  b = Bind{};
  b.c.workspace.data = b.c.qkv_weight.data;
  EXPECT_EQ(b(), "workspace and qkv_weight must not overlap in memory");
  // Good tensors: the device is prepared next, which this GPU-less one refuses.
  const std::string prepare = prepare_refusal("attention_block", kUnpreparedDevice);
  b = Bind{};
  EXPECT_EQ(b(), prepare);
  b.c.cos_sin = TensorRef{};  // a NoPE layer
  b.c.window = 2048;          // on a sliding layer's workspace
  b.c.workspace = md::make_tensor(addr(0x40000000), DType::kUInt8,
                                  {md::attention_block_workspace_bytes(1, 2, 32768, 2048)}, kUnpreparedDevice);
  EXPECT_EQ(b(), prepare);
}

// ---------------------------------------------------------------------------
// Reference.

namespace {

using muse_decode::testing::random_bf16;

using muse_decode::testing::rope_table;

// One small step: R requests of different lengths on shuffled pages of a
// cache of random keys, each request's 8 new rows at its last 8 slots.
struct Step {
  int reqs, kvh, window;
  int64_t pages = 24, table_stride = 6;
  std::vector<uint16_t> x, wqkv, wo, cache;
  std::vector<int64_t> positions, slots;
  std::vector<float> cos_sin;
  std::vector<int32_t> table, lens;

  Step(int r, int kv, int w, bool rope, uint32_t seed) : reqs(r), kvh(kv), window(w) {
    std::mt19937 rng(seed);
    const int T = 8 * reqs;
    x = random_bf16(size_t(T) * 8192, rng, 1.0f);
    wqkv = random_bf16(size_t(md::qkv_width(kvh)) * 8192, rng, 0.02f);
    wo = random_bf16(size_t(8192) * md::o_proj_in_width(kvh), rng, 0.05f);
    cache = random_bf16(size_t(pages) * kvh * 16 * 128, rng, 1.0f);
    if (rope) cos_sin = rope_table(128);
    std::vector<int32_t> order(pages);
    for (int i = 0; i < pages; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    table.assign(size_t(reqs) * table_stride, 1 << 30);  // unused entries point far out of the cache
    const int lengths[] = {37, 8, 70, 23};
    for (int q = 0; q < reqs; ++q) {
      const int L = lengths[q % 4];
      lens.push_back(L);
      for (int j = 0; j < (L + 15) / 16; ++j) table[q * table_stride + j] = order[q * table_stride + j];
      for (int i = 0; i < 8; ++i) {
        const int p = L - 8 + i;
        positions.push_back(p);
        slots.push_back(int64_t{table[q * table_stride + p / 16]} * 16 + p % 16);
      }
    }
  }

  md::reference::AttentionBlockInputs inputs(std::vector<uint16_t>& kv) const {
    md::reference::AttentionBlockInputs in;
    in.x = x.data();
    in.num_reqs = reqs;
    in.qkv_weight = wqkv.data();
    in.num_kv_heads = kvh;
    in.positions = positions.data();
    in.cos_sin = cos_sin.empty() ? nullptr : cos_sin.data();
    in.max_pos = static_cast<int64_t>(cos_sin.size() / 64);
    in.slot_mapping = slots.data();
    in.kv_cache = kv.data();
    in.num_pages = pages;
    in.block_table = table.data();
    in.block_table_stride = table_stride;
    in.seq_lens = lens.data();
    in.window = window;
    in.o_proj_weight = wo.data();
    return in;
  }
};

// The three references chained by hand: the front's rows and their bf16, the
// insert, attention on the q and gate columns and its bf16, and o_proj (fp32,
// or double where exact).
struct ByHand {
  std::vector<uint16_t> qkv, rows, out, cache;
  std::vector<double> exact;
};

ByHand chain_by_hand(const Step& s, bool exact) {
  const int T = 8 * s.reqs, N = md::qkv_width(s.kvh), K = md::o_proj_in_width(s.kvh);
  const md::QkvColumns col = md::qkv_front_columns(s.kvh);
  ByHand h;
  h.cache = s.cache;
  std::vector<double> y(size_t(T) * N);
  md::reference::qkv_front(s.x.data(), 8192, T, s.wqkv.data(), s.kvh, s.positions.data(),
                           s.cos_sin.empty() ? nullptr : s.cos_sin.data(), int64_t(s.cos_sin.size() / 64), y.data());
  for (double v : y) h.qkv.push_back(md::reference::float_to_bf16_bits(static_cast<float>(v)));
  for (int t = 0; t < T; ++t) {
    const int64_t slot = s.slots[t];
    if (slot < 0 || slot >= s.pages * 16) continue;
    for (int kv = 0; kv < s.kvh; ++kv)
      for (int d = 0; d < 64; ++d) {
        const size_t row = ((slot / 16 * s.kvh + kv) * 16 + slot % 16) * 128;
        h.cache[row + d] = h.qkv[size_t(t) * N + col.k + kv * 64 + d];
        h.cache[row + 64 + d] = h.qkv[size_t(t) * N + col.v + kv * 64 + d];
      }
  }
  md::reference::Attn2Inputs a;
  a.q = h.qkv.data();
  a.q_stride = N;
  a.gate = h.qkv.data() + col.gate;
  a.gate_stride = N;
  a.kv_cache = h.cache.data();
  a.num_kv_heads = s.kvh;
  a.block_table = s.table.data();
  a.block_table_stride = s.table_stride;
  a.seq_lens = s.lens.data();
  a.window = s.window;
  std::vector<double> o(size_t(T) * K);
  md::reference::attn2(a, s.reqs, o.data(), K);
  for (double v : o) h.rows.push_back(md::reference::float_to_bf16_bits(static_cast<float>(v)));
  if (exact) {
    h.exact.assign(size_t(T) * 8192, 0.0);
    md::reference::o_proj_exact(h.rows.data(), K, T, s.wo.data(), K, h.exact.data());
  } else {
    h.out.assign(size_t(T) * 8192, 0);
    md::reference::o_proj(h.rows.data(), K, T, s.wo.data(), K, h.out.data(), 8192);
  }
  return h;
}

// What the block's reference made of a step: its out (or y), the steps it
// kept, the cache after it.
struct Block {
  std::vector<uint16_t> out, qkv, rows, cache;
  std::vector<double> y;
};

// The block's reference on step s against the chain by hand, bit for bit:
// the rounded form (exact = false; out in a wider buffer whose padding must
// stay) or the exact one.
Block expect_block_equals_the_chain(const Step& s, bool exact) {
  const int T = 8 * s.reqs, N = md::qkv_width(s.kvh), K = md::o_proj_in_width(s.kvh);
  const ByHand h = chain_by_hand(s, exact);
  constexpr uint16_t kPoison = 0xFFC1;
  const int64_t out_stride = 8192 + 16;
  Block b;
  b.cache = s.cache;
  b.qkv.assign(size_t(T) * N, kPoison);
  b.rows.assign(size_t(T) * K, kPoison);
  const md::reference::AttentionBlockSteps steps{b.qkv.data(), b.rows.data()};
  if (exact) {
    b.y.assign(size_t(T) * 8192, NAN);
    md::reference::attention_block_exact(s.inputs(b.cache), b.y.data(), steps);
    for (size_t i = 0; i < b.y.size(); ++i) EXPECT_EQ(b.y[i], h.exact[i]) << i;
  } else {
    b.out.assign(size_t(T) * out_stride, kPoison);
    md::reference::attention_block(s.inputs(b.cache), b.out.data(), out_stride, steps);
    for (int t = 0; t < T; ++t) {
      for (int n = 0; n < 8192; ++n) EXPECT_EQ(b.out[t * out_stride + n], h.out[size_t(t) * 8192 + n]) << t << " " << n;
      for (int64_t n = 8192; n < out_stride; ++n) EXPECT_EQ(b.out[t * out_stride + n], kPoison) << t << " " << n;
    }
  }
  EXPECT_EQ(b.qkv, h.qkv);
  EXPECT_EQ(b.rows, h.rows);
  EXPECT_EQ(b.cache, h.cache);
  return b;
}

}  // namespace

// Two requests of a TP8 sliding layer with RoPE, pages shuffled, one row a
// pad token (slot -1) and one with a slot past the cache: the block's
// reference is the three references chained, bit for bit, its cache too.
// (The references take about a second per call: one case per form.)
TEST(AttentionBlockReference, IsTheThreeReferencesChained) {
  Step s(2, 2, 20, true, 11);
  s.slots[3] = -1;
  s.slots[12] = s.pages * 16;  // one past the cache: no insert
  const Block b = expect_block_equals_the_chain(s, false);

  // What the step changes: the cache rows of its slots, each the k and v of
  // its row of the projection; nothing else.
  const int N = md::qkv_width(2);
  const md::QkvColumns col = md::qkv_front_columns(2);
  std::vector<bool> written(b.cache.size(), false);
  for (int t = 0; t < 16; ++t) {
    const int64_t slot = s.slots[t];
    if (slot < 0 || slot >= s.pages * 16) continue;
    for (int kv = 0; kv < 2; ++kv)
      for (int d = 0; d < 128; ++d) {
        const size_t i = ((slot / 16 * 2 + kv) * 16 + slot % 16) * 128 + d;
        const int64_t c = d < 64 ? col.k + kv * 64 + d : col.v + kv * 64 + d - 64;
        EXPECT_EQ(b.cache[i], b.qkv[size_t(t) * N + c]) << t << " " << kv << " " << d;
        written[i] = true;
      }
  }
  int changed_elsewhere = 0, written_values = 0;
  for (size_t i = 0; i < b.cache.size(); ++i) {
    changed_elsewhere += !written[i] && b.cache[i] != s.cache[i];
    written_values += written[i];
  }
  EXPECT_EQ(changed_elsewhere, 0);
  EXPECT_EQ(written_values, 14 * 2 * 128);  // 16 rows less the pad and the slot past the cache
  for (int t = 0; t < 16; ++t)
    for (int n = 0; n < 8192; ++n)
      ASSERT_TRUE(std::isfinite(md::reference::bf16_bits_to_float(b.out[t * (8192 + 16) + n]))) << t << " " << n;
}

// One request of a TP4 full layer without RoPE, the exact form.
TEST(AttentionBlockReference, ExactFormIsTheChainWithOProjInDouble) {
  Step s(1, 4, 0, false, 23);
  const Block b = expect_block_equals_the_chain(s, true);
  // The exact sums round to what the fp32 ones do to within a bf16 ulp or two.
  std::vector<uint16_t> out(size_t(8) * 8192);
  md::reference::o_proj(b.rows.data(), 2048, 8, s.wo.data(), 2048, out.data(), 8192);
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = md::reference::bf16_bits_to_float(out[i]);
    ASSERT_LE(std::fabs(got - b.y[i]), std::ldexp(std::fabs(b.y[i]), -7) + 1e-4) << i;
  }
}
