// The verify step's outputs against the CPU references (the oracle of
// muse_decode/reference.h), as the muse-decode tool and examples/engine_step
// check them: each op measured on what it read (the op before's output from
// the GPU), the relative RMS error per head or row of the bf16 outputs, the
// cache rows and the routing exact. What passes is the caller's bar. Host
// code over the public API alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "muse_decode/constants.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"

namespace muse_decode::support {

// The worst relative RMS error of `got` (bf16 bits, rows got_stride apart)
// against `want` (rows of `width`, contiguous) over each `group`
// consecutive columns of a row: a 64-wide head, or a whole row. NaN or Inf
// in got counts as infinite.
inline double worst_group_error(const uint16_t* got, const double* want, int rows, int64_t width, int64_t got_stride,
                                int64_t group = kHeadDim) {
  double worst = 0;
  for (int r = 0; r < rows; ++r)
    for (int64_t h = 0; h < width / group; ++h) {
      double num = 0, den = 0;
      for (int64_t d = 0; d < group; ++d) {
        const double g = reference::bf16_bits_to_float(got[r * got_stride + h * group + d]);
        const double x = want[r * width + h * group + d];
        if (!std::isfinite(g)) return INFINITY;
        num += (g - x) * (g - x);
        den += x * x;
      }
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    }
  return worst;
}

// qkv_front's rows `qkv` ([tokens, qkv_width(num_kv_heads)], contiguous)
// against the reference on the same x (row stride 8192), weight, positions
// and RoPE table (null: none): the worst per head.
inline double qkv_front_error(const uint16_t* x, int tokens, const uint16_t* weight, int num_kv_heads,
                              const int64_t* positions, const float* cos_sin, int max_pos, const uint16_t* qkv) {
  const int n = qkv_width(num_kv_heads);
  std::vector<double> y(size_t(tokens) * n);
  reference::qkv_front(x, kHiddenSize, tokens, weight, num_kv_heads, positions, cos_sin, max_pos, y.data());
  return worst_group_error(qkv, y.data(), tokens, n, n);
}

// The values of the tokens' cache rows (the cache [pages, KVH, 16, 128]) that
// differ from their qkv rows' k and v columns, which the front writes
// bit-identical into the slot of each token (slots[t]).
inline int cache_values_off(const uint16_t* cache, const uint16_t* qkv, const int64_t* slots, int tokens,
                            int num_kv_heads) {
  const QkvColumns col = qkv_front_columns(num_kv_heads);
  int off = 0;
  for (int t = 0; t < tokens; ++t)
    for (int kv = 0; kv < num_kv_heads; ++kv)
      for (int d = 0; d < kCacheRowWidth; ++d) {
        const int64_t s = slots[t];
        const uint16_t c = cache[((s / kPageSize * num_kv_heads + kv) * kPageSize + s % kPageSize) * kCacheRowWidth + d];
        const int64_t column = d < kHeadDim ? col.k + kv * kHeadDim + d : col.v + kv * kHeadDim + d - kHeadDim;
        off += c != qkv[t * col.width + column];
      }
  return off;
}

// attn2's reference inputs: q and gate in the front's rows `qkv` (contiguous
// [R * 8, qkv_width(num_kv_heads)]), the cache, the block table (rows
// table_stride apart), the lengths and the window.
inline reference::Attn2Inputs attn2_inputs(const uint16_t* qkv, int num_kv_heads, const uint16_t* cache,
                                           const int32_t* table, int64_t table_stride, const int32_t* lens, int window) {
  const QkvColumns col = qkv_front_columns(num_kv_heads);
  reference::Attn2Inputs in;
  in.q = qkv;
  in.q_stride = col.width;
  in.gate = qkv + col.gate;
  in.gate_stride = col.width;
  in.kv_cache = cache;
  in.num_kv_heads = num_kv_heads;
  in.block_table = table;
  in.block_table_stride = table_stride;
  in.seq_lens = lens;
  in.window = window;
  return in;
}

// attn2's rows `out` ([R * 8, KVH * 8 * 64], contiguous) of request `req`
// and KV head `kv_head` against the reference: the worst per row and head.
inline double attn2_error(const reference::Attn2Inputs& in, int req, int kv_head, const uint16_t* out) {
  constexpr int kWidth = kHeadsPerKvHead * kHeadDim;  // the KV head's 8 heads in a row
  std::vector<double> want(size_t(kVerifyLen) * kWidth);
  reference::attn2_pair(in, req, kv_head, want.data());
  const int64_t stride = int64_t(in.num_kv_heads) * kWidth;
  return worst_group_error(out + req * kVerifyLen * stride + kv_head * kWidth, want.data(), kVerifyLen, kWidth, stride);
}

// o_proj's rows `hidden` ([tokens, 8192], contiguous) against the fp64 sums
// of the same x ([tokens, in_width], contiguous) and weight: the worst per row.
inline double o_proj_error(const uint16_t* x, int tokens, int in_width, const uint16_t* weight, const uint16_t* hidden) {
  std::vector<double> y(size_t(tokens) * kOProjOutWidth);
  reference::o_proj_exact(x, in_width, tokens, weight, in_width, y.data());
  return worst_group_error(hidden, y.data(), tokens, kOProjOutWidth, kOProjOutWidth, kOProjOutWidth);
}

// How far an attention_block call's results are from its reference: the
// worst relative RMS error per row of out (its 8192 columns), and per token,
// KV head and half (k or v, 64 values) of the cache rows the call inserted.
struct BlockError {
  double out = 0;
  double cache = 0;
};

// attention_block's out (rows out_stride apart) of the requests `reqs`, and
// the cache rows of their tokens (`cache`: the whole cache after the call),
// against the reference (reference::attention_block_exact: the three ops'
// references chained, qkv_front's and attn2's rows rounded to bf16 as the ops
// store them, o_proj's sums in double), one request at a time on a copy of
// that cache, into which the reference inserts its own k and v; in.kv_cache
// is not read. The block sums in its own order, so its k and v may differ
// from the reference's in the last place: the cache rows are measured as a
// head is, not bit for bit.
inline BlockError attention_block_error(reference::AttentionBlockInputs in, const std::vector<int>& reqs,
                                        const uint16_t* out, int64_t out_stride, const uint16_t* cache) {
  const int kvh = in.num_kv_heads;
  const QkvColumns col = qkv_front_columns(kvh);
  std::vector<uint16_t> ref_cache(cache, cache + in.num_pages * kvh * kPageSize * kCacheRowWidth);
  std::vector<uint16_t> qkv(size_t(kVerifyLen) * col.width);
  std::vector<double> want(size_t(kVerifyLen) * kOProjOutWidth), kv_want(kHeadDim);
  BlockError err;
  for (const int r : reqs) {
    const int t0 = r * kVerifyLen;
    reference::AttentionBlockInputs one = in;  // request r alone: its rows, its table row, its length
    one.x = in.x + t0 * in.x_stride;
    one.num_reqs = 1;
    one.positions = in.positions + t0;
    one.slot_mapping = in.slot_mapping + t0;
    one.kv_cache = ref_cache.data();
    one.block_table = in.block_table + r * in.block_table_stride;
    one.seq_lens = in.seq_lens + r;
    reference::AttentionBlockSteps steps;
    steps.qkv = qkv.data();
    reference::attention_block_exact(one, want.data(), steps);
    err.out = std::max(err.out, worst_group_error(out + t0 * out_stride, want.data(), kVerifyLen, kOProjOutWidth,
                                                  out_stride, kOProjOutWidth));
    for (int t = 0; t < kVerifyLen; ++t) {
      const int64_t slot = one.slot_mapping[t];
      if (slot < 0 || slot >= in.num_pages * kPageSize) continue;
      for (int kv = 0; kv < kvh; ++kv)
        for (int half = 0; half < 2; ++half) {
          const int64_t from = t * col.width + (half ? col.v : col.k) + kv * kHeadDim;
          for (int d = 0; d < kHeadDim; ++d) kv_want[d] = reference::bf16_bits_to_float(qkv[from + d]);
          const int64_t row = ((slot / kPageSize * kvh + kv) * kPageSize + slot % kPageSize) * kCacheRowWidth;
          err.cache = std::max(err.cache, worst_group_error(cache + row + half * kHeadDim, kv_want.data(), 1,
                                                            kHeadDim, kHeadDim));
        }
    }
  }
  return err;
}

// One route call's ids, weights and metadata against the reference. The
// host's expf and CUDA's may differ in the last bit, so an id may differ
// where two keys tie to within that (`ids_differ` counts them all,
// `ids_apart` those whose keys, in double, are more than 1e-6 apart or that
// are no expert); the weights of equal ids are within 1e-6 relative, and the
// metadata of the GPU's ids is exact.
struct RouteDiff {
  int ids_differ = 0;
  int ids_apart = 0;
  int weights_off = 0;
  bool metadata_differs = false;
};
inline RouteDiff route_diff(const float* logits, int tokens, const float* bias, const int32_t* ids,
                            const float* weights, const int32_t* metadata, int local_expert_offset,
                            int num_local_experts, int tile_n) {
  const int routes = tokens * kTopK;
  std::vector<int32_t> want_ids(routes), want_meta(metadata_size(tile_n), -1);
  std::vector<float> want_w(routes);
  reference::route(logits, tokens, bias, 1.0f, want_ids.data(), want_w.data());
  auto key = [&](int token, int e) {
    return 1.0 / (1.0 + std::exp(-double(logits[token * kNumExperts + e]))) + bias[e];
  };
  RouteDiff diff;
  for (int r = 0; r < routes; ++r) {
    if (ids[r] == want_ids[r]) {
      diff.weights_off += std::fabs(weights[r] - want_w[r]) > 1e-6f * std::fabs(want_w[r]) + 1e-9f;
    } else {
      ++diff.ids_differ;
      diff.ids_apart += ids[r] < 0 || ids[r] >= kNumExperts ||
                        std::fabs(key(r / kTopK, ids[r]) - key(r / kTopK, want_ids[r])) > 1e-6;
    }
  }
  reference::routing_metadata(ids, tokens, local_expert_offset, num_local_experts, tile_n, want_meta.data());
  diff.metadata_differs = !std::equal(want_meta.begin(), want_meta.end(), metadata);
  return diff;
}

}  // namespace muse_decode::support
