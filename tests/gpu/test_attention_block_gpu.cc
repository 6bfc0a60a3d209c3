// GPU tests of attention_block (qkv_front, attn2 and o_proj of one layer in
// one cooperative launch) against the three ops chained on a copy of the same
// inputs and against the fp64 reference of that chain (qkv_front's rows and
// attn2's in double, each rounded to bf16 as the ops store them, o_proj's
// sums in double): out within relative RMS 5e-3 per row, no NaN or Inf, at
// TP8 (2 KV heads) and TP4 (4), 1, 2, 3 and 8 requests of odd lengths (8, 9,
// 17, 2047, 2049, 5000, 32768 at max_model_len 32768), full layers and the
// sliding window of 2048 (with RoPE); in every case pages in shuffled order,
// NaN in the unused pages, in the new tokens' cache rows before the call and
// in x's row padding, out ids past each request's pages; the KV cache bit for
// bit as before the call except the new tokens' rows, which hold the block's
// own k and v (the workspace's projection rows) and are within a bf16 ulp of
// the chain's; the bytes around out (guard rows, a wider row stride) and the
// workspace's counters left as they were. Also: graph capture then replay
// with new lengths, positions, block tables and x; the same bits over runs,
// over grids and through the bound form; NaN rows of a request whose L or
// page id breaks the contract, the other requests right; a slot outside the
// cache inserts nothing; a launch behind another stream's kernel that holds
// most SMs waits for it instead of hanging; refused calls launch nothing.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../cpu/check_util.h"
#include "attention_block/params.h"
#include "gpu_util.h"
#include "muse_decode/attention_block.h"
#include "muse_decode/attn2.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference/attention_block.h"
#include "muse_decode/reference/attn2.h"
#include "muse_decode/reference/o_proj.h"
#include "muse_decode/reference/qkv_front.h"

namespace md = muse_decode;
namespace impl = muse_decode::attention_block_impl;
using md::DType;
using md::TensorRef;

namespace {

constexpr uint16_t kNaNBits = 0x7FC0;  // bf16 quiet NaN: unused pages, new rows before the call, x's padding
constexpr uint16_t kPoison = 0xFFFF;   // another NaN, around and in out before a call
constexpr double kTolerance = 5e-3;
constexpr int kHidden = md::kHiddenSize;
constexpr int kMaxLen = 32768;                 // max_model_len of most cases, and the RoPE table's rows
constexpr int64_t kXStride = kHidden + 64;     // x rows with padding
constexpr int64_t kOutStride = kHidden + 64;   // out rows 64 columns wider than out
constexpr int64_t kOutColumn = 32;             // out's view starts at column 32 of row 1 of its buffer

float bf16f(uint16_t b) { return md::reference::bf16_bits_to_float(b); }
uint16_t bf16(float f) { return md::reference::float_to_bf16_bits(f); }


// Runs f(i) for i in [0, n) on the host's cores.
template <typename F>
void parallel_for(int n, F&& f) {
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) f(i);
    });
  for (auto& t : pool) t.join();
}

// Ids a block table holds past a request's pages: all outside [0, pages).
int32_t bad_id(int k, int num_pages) {
  const int32_t ids[] = {-1, num_pages, num_pages + 1000, INT32_MAX, INT32_MIN};
  return ids[k % 5];
}

// Whether two bf16 values of the same k or v are the same up to the order of
// their fp32 sums: within one unit in the last place of the larger, or 1e-4
// apart (values near zero, whose unit is below the sums' own differences).
bool within_ulp(uint16_t a, uint16_t b) {
  const double x = bf16f(a), y = bf16f(b);
  if (!std::isfinite(x) || !std::isfinite(y)) return false;
  const double big = std::max(std::fabs(x), std::fabs(y));
  const double ulp = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0.0;
  return std::fabs(x - y) <= std::max(ulp, 1e-4);
}

// The relative RMS error of 8192 bf16 values against the reference's;
// infinite when one is not finite.
double row_error(const uint16_t* got, const double* want) {
  double err = 0.0, norm = 0.0;
  for (int c = 0; c < kHidden; ++c) {
    const double g = bf16f(got[c]);
    if (!std::isfinite(g)) return INFINITY;
    err += (g - want[c]) * (g - want[c]);
    norm += want[c] * want[c];
  }
  return std::sqrt(err / norm);
}

// A layer's static tensors at one KV-head count, shared by the problems of
// that count: the fused QKV weight, o_proj's weight (both at realistic
// scales: 1/sqrt(K) ~ 0.01 .. 0.02) and the RoPE table of kMaxLen rows.
struct Weights {
  int kvh, n, k_in;
  std::vector<uint16_t> w_qkv, w_o;
  std::vector<float> cos_sin;
  std::unique_ptr<DeviceBuffer<uint16_t>> d_w_qkv, d_w_o;
  std::unique_ptr<DeviceBuffer<float>> d_cos_sin;

  explicit Weights(int kv_heads) : kvh(kv_heads), n(md::qkv_width(kv_heads)), k_in(md::o_proj_in_width(kv_heads)) {
    auto fill = [](std::vector<uint16_t>& v, size_t count, float scale, uint64_t seed) {
      v.resize(count);
      parallel_for(64, [&](int part) {
        SplitMix r{seed + 977ull * (part + 1)};
        for (size_t k = part; k < count; k += 64) v[k] = bf16(scale * r.uniform());
      });
    };
    fill(w_qkv, static_cast<size_t>(n) * kHidden, 0.02f, 1000 + kvh);
    fill(w_o, static_cast<size_t>(kHidden) * k_in, 0.03f, 2000 + kvh);
    cos_sin.resize(static_cast<size_t>(kMaxLen) * 64);
    for (int p = 0; p < kMaxLen; ++p)
      for (int j = 0; j < 32; ++j) {
        const double a = p * std::pow(md::kRopeTheta, -2.0 * j / 64.0);
        cos_sin[p * 64 + j] = static_cast<float>(std::cos(a));
        cos_sin[p * 64 + 32 + j] = static_cast<float>(std::sin(a));
      }
    d_w_qkv = std::make_unique<DeviceBuffer<uint16_t>>(w_qkv.size());
    d_w_o = std::make_unique<DeviceBuffer<uint16_t>>(w_o.size());
    d_cos_sin = std::make_unique<DeviceBuffer<float>>(cos_sin.size());
    d_w_qkv->upload(w_qkv);
    d_w_o->upload(w_o);
    d_cos_sin->upload(cos_sin);
  }
};

// Made once per KV-head count for the whole suite.
const Weights& weights(int kvh) {
  static std::map<int, std::unique_ptr<Weights>> made;
  auto& w = made[kvh];
  if (!w) w = std::make_unique<Weights>(kvh);
  return *w;
}

// What the chain's reference makes of a problem's inputs.
struct Expected {
  std::vector<double> qkv;       // [T, n]: qkv_front's rows in double
  std::vector<uint16_t> qkv_bf;  // the same rounded to bf16, as the op stores them
  std::vector<uint16_t> cache;   // the cache with those k and v inserted at the slots inside it
  std::vector<double> out;       // [T, 8192]: o_proj's sums of attn2's rows; rows of NaN requests 0
};

// One step of R requests on one layer: the inputs in host memory and on the
// device, the block's buffers (out as a view into a poisoned buffer with a
// guard row above and below and wider rows; its workspace) and the chain's
// (its own copy of the cache, qkv_front's and attn2's rows, o_proj's out,
// their workspaces).
struct Problem {
  const Weights& w;
  int kvh, n, k_in, reqs, T, mml, window, splits, max_pages, num_pages;
  bool rope;
  SplitMix rng;
  std::vector<int32_t> lens, table;
  std::vector<int64_t> positions, slots;
  std::vector<uint16_t> x, cache;  // cache: as it is before a call
  impl::WorkspaceLayout layout;
  int64_t ws_bytes;
  std::unique_ptr<DeviceBuffer<uint16_t>> d_x, d_cache, d_cache2, d_out, d_qkv, d_attn, d_chain_out;
  std::unique_ptr<DeviceBuffer<int64_t>> d_pos, d_slots;
  std::unique_ptr<DeviceBuffer<int32_t>> d_table, d_lens;
  std::unique_ptr<DeviceBuffer<uint8_t>> d_ws, d_front_ws, d_attn_ws;
  cudaStream_t stream = nullptr;

  // Pages for `lens` (clipped into [8, max_model_len] for the contract
  // breaks) and `extra_pages` more: later steps may take at most as many.
  Problem(const Weights& weights_, std::vector<int> lens_, int mml_, bool sliding, uint64_t seed, int extra_pages = 16)
      : w(weights_),
        kvh(weights_.kvh),
        n(weights_.n),
        k_in(weights_.k_in),
        reqs(static_cast<int>(lens_.size())),
        T(8 * reqs),
        mml(mml_),
        rope(sliding),
        rng{seed * 0x5851F42Dull + 17} {
    window = md::attn2_window(sliding ? std::optional<int>(md::kSlidingWindow) : std::nullopt, mml);
    splits = md::attn2_splits(mml, window, kvh);
    max_pages = (mml + 15) / 16;
    num_pages = extra_pages;
    for (int L : lens_) num_pages += own_pages(L);
    layout = impl::workspace_layout(reqs, kvh, impl::splits_of(reqs, kvh, mml, window));
    ws_bytes = md::attention_block_workspace_bytes(reqs, kvh, mml, window);
    const size_t cache_elems = static_cast<size_t>(num_pages) * kvh * 16 * 128;
    d_x = std::make_unique<DeviceBuffer<uint16_t>>(static_cast<size_t>(T) * kXStride);
    d_cache = std::make_unique<DeviceBuffer<uint16_t>>(cache_elems);
    d_cache2 = std::make_unique<DeviceBuffer<uint16_t>>(cache_elems);
    d_out = std::make_unique<DeviceBuffer<uint16_t>>(static_cast<size_t>(T + 2) * kOutStride);
    d_qkv = std::make_unique<DeviceBuffer<uint16_t>>(static_cast<size_t>(T) * n);
    d_attn = std::make_unique<DeviceBuffer<uint16_t>>(static_cast<size_t>(T) * k_in);
    d_chain_out = std::make_unique<DeviceBuffer<uint16_t>>(static_cast<size_t>(T) * kHidden);
    d_pos = std::make_unique<DeviceBuffer<int64_t>>(T);
    d_slots = std::make_unique<DeviceBuffer<int64_t>>(T);
    d_table = std::make_unique<DeviceBuffer<int32_t>>(static_cast<size_t>(reqs) * max_pages);
    d_lens = std::make_unique<DeviceBuffer<int32_t>>(reqs);
    d_ws = std::make_unique<DeviceBuffer<uint8_t>>(ws_bytes);
    d_front_ws = std::make_unique<DeviceBuffer<uint8_t>>(md::qkv_front_workspace_bytes_for_device(kvh));
    d_attn_ws =
        std::make_unique<DeviceBuffer<uint8_t>>(std::max<int64_t>(md::attn2_workspace_bytes(reqs, kvh, splits), 16));
    // Zeroed once, at allocation: every launch leaves them so.
    d_ws->fill_bytes(0);
    d_front_ws->fill_bytes(0);
    d_attn_ws->fill_bytes(0);
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    new_step(lens_);
  }
  ~Problem() { cudaStreamDestroy(stream); }

  int clipped(int L) const { return std::clamp(L, 8, mml); }
  int own_pages(int L) const { return (clipped(L) + 15) / 16; }

  // A fresh step of the given lengths, uploaded: pages drawn in shuffled
  // order from the pool, ids past each request's own pages out of range; a
  // cache of NaN but for random keys and values below each request's 8 new
  // tokens (the tokens' own rows stay NaN: the block must insert them before
  // its attention reads them); the tokens at positions L - 8 .. L - 1 with
  // their slots through the table; fresh x (NaN in its row padding).
  void new_step(const std::vector<int>& new_lens) {
    lens.assign(new_lens.begin(), new_lens.end());
    std::vector<int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = num_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    table.assign(static_cast<size_t>(reqs) * max_pages, 0);
    int next = 0;
    for (int r = 0; r < reqs; ++r)
      for (int pg = 0; pg < max_pages; ++pg)
        table[static_cast<size_t>(r) * max_pages + pg] =
            pg < own_pages(lens[r]) ? perm[next++] : bad_id(pg + r, num_pages);
    cache.assign(static_cast<size_t>(num_pages) * kvh * 16 * 128, kNaNBits);
    positions.resize(T);
    slots.resize(T);
    for (int r = 0; r < reqs; ++r) {
      const int L = clipped(lens[r]);
      for (int j = 0; j < L - 8; ++j)
        for (int kv = 0; kv < kvh; ++kv) {
          uint16_t* row = key_row(r, j, kv);
          for (int d = 0; d < 128; ++d) row[d] = bf16(rng.uniform());
        }
      for (int i = 0; i < 8; ++i) {
        const int p = L - 8 + i;
        positions[r * 8 + i] = p;
        slots[r * 8 + i] = static_cast<int64_t>(table[static_cast<size_t>(r) * max_pages + p / 16]) * 16 + p % 16;
      }
    }
    x.assign(static_cast<size_t>(T) * kXStride, kNaNBits);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < kHidden; ++k) x[t * kXStride + k] = bf16(rng.uniform());
    upload();
  }

  // Key j of request r, KV head kv, in the host cache: 64 K then 64 V values.
  uint16_t* key_row(int r, int j, int kv) {
    const int64_t page = table[static_cast<size_t>(r) * max_pages + j / 16];
    return &cache[((page * kvh + kv) * 16 + j % 16) * 128];
  }
  size_t slot_row(int64_t slot, int kv) const {
    return static_cast<size_t>(((slot / 16) * kvh + kv) * 16 + slot % 16) * 128;
  }
  bool in_cache(int64_t slot) const { return slot >= 0 && slot < static_cast<int64_t>(num_pages) * 16; }

  // The host's inputs into both devices' copies (the cache into the block's
  // and the chain's).
  void upload() const {
    d_x->upload(x);
    d_pos->upload(positions);
    d_slots->upload(slots);
    d_table->upload(table);
    d_lens->upload(lens);
    d_cache->upload(cache);
    d_cache2->upload(cache);
  }

  uint16_t* out_view() const { return d_out->get() + kOutStride + kOutColumn; }

  md::AttentionBlockArgs args() const {
    md::AttentionBlockArgs a;
    a.x = md::make_tensor(d_x->get(), DType::kBFloat16, {T, kHidden});
    a.x.stride[0] = kXStride;
    a.qkv_weight = md::make_tensor(w.d_w_qkv->get(), DType::kBFloat16, {n, kHidden});
    a.positions = md::make_tensor(d_pos->get(), DType::kInt64, {T});
    if (rope) a.cos_sin = md::make_tensor(w.d_cos_sin->get(), DType::kFloat32, {kMaxLen, 64});
    a.slot_mapping = md::make_tensor(d_slots->get(), DType::kInt64, {T});
    a.kv_cache = md::make_tensor(d_cache->get(), DType::kBFloat16, {num_pages, kvh, 16, 128});
    a.num_kv_heads = kvh;
    a.block_table = md::make_tensor(d_table->get(), DType::kInt32, {reqs, max_pages});
    a.seq_lens = md::make_tensor(d_lens->get(), DType::kInt32, {reqs});
    a.max_model_len = mml;
    a.window = window;
    a.o_proj_weight = md::make_tensor(w.d_w_o->get(), DType::kBFloat16, {kHidden, k_in});
    a.out = md::make_tensor(out_view(), DType::kBFloat16, {T, kHidden});
    a.out.stride[0] = kOutStride;
    a.workspace = md::make_tensor(d_ws->get(), DType::kUInt8, {ws_bytes});
    return a;
  }
  md::Stream st() const { return reinterpret_cast<md::Stream>(stream); }

  void poison() const { d_out->upload(std::vector<uint16_t>(d_out->size(), kPoison)); }

  // One block call on poisoned out; the whole out buffer after it.
  std::vector<uint16_t> run_block() const {
    poison();
    md::attention_block(args(), st());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return d_out->download();
  }

  // The three ops chained on the chain's copy of the cache: qkv_front 16
  // tokens at a time, attn2 on q and gate in place, o_proj; the chain's out.
  std::vector<uint16_t> run_chain() const {
    for (int t0 = 0; t0 < T; t0 += md::kFrontMaxTokens) {
      const int tn = std::min(md::kFrontMaxTokens, T - t0);
      md::QkvFrontArgs a;
      a.x = md::make_tensor(d_x->get() + t0 * kXStride, DType::kBFloat16, {tn, kHidden});
      a.x.stride[0] = kXStride;
      a.weight = md::make_tensor(w.d_w_qkv->get(), DType::kBFloat16, {n, kHidden});
      a.positions = md::make_tensor(d_pos->get() + t0, DType::kInt64, {tn});
      if (rope) a.cos_sin = md::make_tensor(w.d_cos_sin->get(), DType::kFloat32, {kMaxLen, 64});
      a.slot_mapping = md::make_tensor(d_slots->get() + t0, DType::kInt64, {tn});
      a.kv_cache = md::make_tensor(d_cache2->get(), DType::kBFloat16, {num_pages, kvh, 16, 128});
      a.num_kv_heads = kvh;
      a.out = md::make_tensor(d_qkv->get() + static_cast<size_t>(t0) * n, DType::kBFloat16, {tn, n});
      a.workspace = md::make_tensor(d_front_ws->get(), DType::kUInt8, {static_cast<int64_t>(d_front_ws->size())});
      md::qkv_front(a, st());
    }
    const md::QkvViews qg = md::split_qkv(md::make_tensor(d_qkv->get(), DType::kBFloat16, {T, n}), kvh);
    md::Attn2Args a;
    a.q = qg.q;
    a.gate = qg.gate;
    a.kv_cache = md::make_tensor(d_cache2->get(), DType::kBFloat16, {num_pages, kvh, 16, 128});
    a.block_table = md::make_tensor(d_table->get(), DType::kInt32, {reqs, max_pages});
    a.seq_lens = md::make_tensor(d_lens->get(), DType::kInt32, {reqs});
    a.out = md::make_tensor(d_attn->get(), DType::kBFloat16, {T, k_in});
    a.workspace = md::make_tensor(d_attn_ws->get(), DType::kUInt8, {static_cast<int64_t>(d_attn_ws->size())});
    a.max_model_len = mml;
    a.window = window;
    a.num_splits = splits;
    md::attn2(a, st());
    md::OProjArgs o;
    o.x = md::make_tensor(d_attn->get(), DType::kBFloat16, {T, k_in});
    o.weight = md::make_tensor(w.d_w_o->get(), DType::kBFloat16, {kHidden, k_in});
    o.out = md::make_tensor(d_chain_out->get(), DType::kBFloat16, {T, kHidden});
    md::o_proj(o, st());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return d_chain_out->download();
  }

  // The chain's reference of the host's inputs, reference::attention_block_exact's
  // steps spread over the host's cores (TheOracleIsTheReference checks that
  // it is that function's); requests in nan_reqs break the contract and get
  // no attention or o_proj rows.
  Expected reference(const std::vector<int>& nan_reqs = {}) const {
    Expected e;
    e.qkv.assign(static_cast<size_t>(T) * n, 0.0);
    parallel_for(T, [&](int t) {
      md::reference::qkv_front(&x[t * kXStride], kXStride, 1, w.w_qkv.data(), kvh, &positions[t],
                               rope ? w.cos_sin.data() : nullptr, kMaxLen, &e.qkv[static_cast<size_t>(t) * n]);
    });
    e.qkv_bf.resize(e.qkv.size());
    for (size_t i = 0; i < e.qkv.size(); ++i) e.qkv_bf[i] = bf16(static_cast<float>(e.qkv[i]));
    const md::QkvColumns col = md::qkv_front_columns(kvh);
    e.cache = cache;
    for (int t = 0; t < T; ++t) {
      if (!in_cache(slots[t])) continue;
      for (int kv = 0; kv < kvh; ++kv)
        for (int d = 0; d < 64; ++d) {
          e.cache[slot_row(slots[t], kv) + d] = e.qkv_bf[static_cast<size_t>(t) * n + col.k + kv * 64 + d];
          e.cache[slot_row(slots[t], kv) + 64 + d] = e.qkv_bf[static_cast<size_t>(t) * n + col.v + kv * 64 + d];
        }
    }
    md::reference::Attn2Inputs in;
    in.q = e.qkv_bf.data();
    in.q_stride = n;
    in.gate = e.qkv_bf.data() + col.gate;
    in.gate_stride = n;
    in.kv_cache = e.cache.data();
    in.num_kv_heads = kvh;
    in.block_table = table.data();
    in.block_table_stride = max_pages;
    in.seq_lens = lens.data();
    in.window = window;
    std::vector<std::pair<int, int>> pairs;
    std::vector<int> rows;
    for (int r = 0; r < reqs; ++r) {
      if (std::find(nan_reqs.begin(), nan_reqs.end(), r) != nan_reqs.end()) continue;
      for (int kv = 0; kv < kvh; ++kv) pairs.push_back({r, kv});
      for (int i = 0; i < 8; ++i) rows.push_back(r * 8 + i);
    }
    // The longest first, over every core.
    std::sort(pairs.begin(), pairs.end(), [&](auto a, auto b) { return lens[a.first] > lens[b.first]; });
    std::vector<uint16_t> attn(static_cast<size_t>(T) * k_in, 0);
    parallel_for(static_cast<int>(pairs.size()), [&](int k) {
      const auto [r, kv] = pairs[k];
      std::vector<double> o(8 * 8 * 64);
      md::reference::attn2_pair(in, r, kv, o.data());
      for (int i = 0; i < 8; ++i)
        for (int c = 0; c < 8 * 64; ++c)
          attn[static_cast<size_t>(r * 8 + i) * k_in + kv * 512 + c] = bf16(static_cast<float>(o[i * 512 + c]));
    });
    e.out.assign(static_cast<size_t>(T) * kHidden, 0.0);
    parallel_for(static_cast<int>(rows.size()), [&](int k) {
      const int t = rows[k];
      md::reference::o_proj_exact(&attn[static_cast<size_t>(t) * k_in], k_in, 1, w.w_o.data(), k_in,
                                  &e.out[static_cast<size_t>(t) * kHidden]);
    });
    return e;
  }

  // The block's out (its whole buffer): nothing written around it, the rows
  // of nan_reqs all NaN, the others finite and within the bar of the
  // reference. Returns the worst relative RMS error per row.
  double check_out(const std::vector<uint16_t>& buf, const Expected& e, const std::vector<int>& nan_reqs = {}) const {
    size_t guard_bad = 0;
    for (int64_t r = 0; r < T + 2; ++r)
      for (int64_t c = 0; c < kOutStride; ++c) {
        const bool inside = r >= 1 && r <= T && c >= kOutColumn && c < kOutColumn + kHidden;
        if (!inside && buf[r * kOutStride + c] != kPoison) ++guard_bad;
      }
    EXPECT_EQ(guard_bad, 0u) << "bytes outside out were written";
    double worst = 0.0;
    for (int r = 0; r < reqs; ++r) {
      const bool nan = std::find(nan_reqs.begin(), nan_reqs.end(), r) != nan_reqs.end();
      for (int i = 0; i < 8; ++i) {
        const int t = r * 8 + i;
        const uint16_t* row = &buf[(t + 1) * kOutStride + kOutColumn];
        if (nan) {
          const size_t not_nan = std::count_if(row, row + kHidden, [](uint16_t v) { return !std::isnan(bf16f(v)); });
          EXPECT_EQ(not_nan, 0u) << "request " << r << " (L = " << lens[r] << ") breaks the contract: row " << t
                                 << " must be NaN";
          continue;
        }
        const double err = row_error(row, &e.out[static_cast<size_t>(t) * kHidden]);
        worst = std::max(worst, err);
        EXPECT_LE(err, kTolerance) << "request " << r << " (L = " << lens[r] << ") row " << t
                                   << (std::isfinite(err) ? ": relative RMS error" : ": not finite");
      }
    }
    return worst;
  }

  // The worst relative RMS error per row of the block's out against the
  // chain's out (contiguous rows).
  double block_vs_chain(const std::vector<uint16_t>& buf, const std::vector<uint16_t>& chain) const {
    double worst = 0.0;
    std::vector<double> want(kHidden);
    for (int t = 0; t < T; ++t) {
      for (int c = 0; c < kHidden; ++c) want[c] = bf16f(chain[static_cast<size_t>(t) * kHidden + c]);
      worst = std::max(worst, row_error(&buf[(t + 1) * kOutStride + kOutColumn], want.data()));
    }
    return worst;
  }

  // The block's workspace after a call: the next launch's set of phase
  // counters all zero (the epoch's parity picks it), and each token group's
  // tile counters of the front back at zero; returns the projection rows
  // [T, n] it holds.
  std::vector<uint16_t> check_workspace() const {
    const auto ws = d_ws->download();
    // The words of [offset, offset + 4 * count) left nonzero, and the first.
    auto left_set = [&](int64_t offset, int count, const char* what) {
      const uint32_t* words = reinterpret_cast<const uint32_t*>(ws.data() + offset);
      const int set = static_cast<int>(std::count_if(words, words + count, [](uint32_t v) { return v != 0; }));
      const int first = static_cast<int>(std::find_if(words, words + count, [](uint32_t v) { return v != 0; }) - words);
      EXPECT_EQ(set, 0) << what << ": " << set << " of " << count << " words left nonzero, the first " << first;
    };
    const uint32_t epoch = *reinterpret_cast<const uint32_t*>(ws.data() + layout.counters + 4 * impl::kEpochWord);
    EXPECT_GT(epoch, 0u) << "the epoch advances with each launch";
    left_set(layout.counters + 4 * (impl::kCounterSets + (epoch & 1) * impl::kCounterSetWords),
             impl::kCounterSetWords, "the next launch's counters");
    const int groups = (T + impl::kTokenGroup - 1) / impl::kTokenGroup;
    for (int g = 0; g < groups; ++g)
      left_set(layout.front + g * layout.front_group_bytes, n / 64,
               ("token group " + std::to_string(g) + "'s tile counters").c_str());
    std::vector<uint16_t> qkv(static_cast<size_t>(T) * n);
    std::memcpy(qkv.data(), ws.data() + layout.qkv, qkv.size() * 2);
    return qkv;
  }

  // The block's cache after a call: every value as before it but the rows of
  // the tokens' slots inside the cache, which hold the k and v columns of the
  // block's own projection rows `qkv` bit for bit; those rows within the bar
  // of the reference's per head (so that qkv is the projection). With the
  // chain's cache, its new rows within a bf16 ulp of the block's.
  void check_cache(const std::vector<uint16_t>& qkv, const Expected& e,
                   const std::vector<uint16_t>* chain = nullptr) const {
    const md::QkvColumns col = md::qkv_front_columns(kvh);
    double worst = 0.0;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < n / 64; ++h) {
        double err = 0.0, norm = 0.0;
        for (int d = 0; d < 64; ++d) {
          const double g = bf16f(qkv[static_cast<size_t>(t) * n + h * 64 + d]);
          const double want = e.qkv[static_cast<size_t>(t) * n + h * 64 + d];
          err += std::isfinite(g) ? (g - want) * (g - want) : INFINITY;
          norm += want * want;
        }
        worst = std::max(worst, std::sqrt(err / norm));
      }
    EXPECT_LE(worst, kTolerance) << "the workspace's projection rows are not the projection (worst head)";
    std::vector<uint16_t> want = cache;
    for (int t = 0; t < T; ++t) {
      if (!in_cache(slots[t])) continue;
      for (int kv = 0; kv < kvh; ++kv)
        for (int d = 0; d < 64; ++d) {
          want[slot_row(slots[t], kv) + d] = qkv[static_cast<size_t>(t) * n + col.k + kv * 64 + d];
          want[slot_row(slots[t], kv) + 64 + d] = qkv[static_cast<size_t>(t) * n + col.v + kv * 64 + d];
        }
    }
    const auto got = d_cache->download();
    size_t off = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
        ++off;
        first = std::min(first, i);
      }
    EXPECT_EQ(off, 0u) << "cache values differ from the block's k and v or from before the call, the first at element "
                       << first << " (page " << first / (kvh * 16 * 128) << ", row " << (first / 128) % 16 << ", col "
                       << first % 128 << ")";
    if (!chain) return;
    size_t apart = 0;
    for (int t = 0; t < T; ++t) {
      if (!in_cache(slots[t])) continue;
      for (int kv = 0; kv < kvh; ++kv)
        for (int d = 0; d < 128; ++d) {
          const size_t i = slot_row(slots[t], kv) + d;
          apart += !within_ulp(got[i], (*chain)[i]);
        }
    }
    EXPECT_EQ(apart, 0u) << "new cache values of the block more than a bf16 ulp from the chain's";
  }

  // One block call and one of the chain on the same inputs, every check;
  // returns the worst relative RMS error per row of the block's out.
  double run_and_check(const char* what) {
    SCOPED_TRACE(::testing::Message() << what << ": KVH " << kvh << ", R " << reqs << ", max_model_len " << mml
                                      << ", window " << window);
    const Expected e = reference();
    const auto out = run_block();
    const double worst = check_out(out, e);
    const auto qkv = check_workspace();
    const auto chain = run_chain();
    const auto chain_cache = d_cache2->download();
    check_cache(qkv, e, &chain_cache);
    double chain_worst = 0.0;
    for (size_t t = 0; t < static_cast<size_t>(T); ++t)
      chain_worst = std::max(chain_worst, row_error(&chain[t * kHidden], &e.out[t * kHidden]));
    EXPECT_LE(chain_worst, kTolerance) << "the chain itself misses the reference (the reference is wrong?)";
    // Both within the bar of the same reference, so within twice it of each other.
    const double apart = block_vs_chain(out, chain);
    EXPECT_LE(apart, 2 * kTolerance) << "the block's out and the chain's";
    std::printf("[ attn_block ] %s: KVH %d, R %d, max_model_len %d, window %4d: max rel RMS per row %.2e (chain "
                "%.2e, block vs chain %.2e)\n",
                what, kvh, reqs, mml, window, worst, chain_worst, apart);
    return worst;
  }
};

class AttentionBlockGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    md::prepare_attention_block();
    md::prepare_qkv_front();
    md::prepare_attn2();
    md::prepare_o_proj();
  }
};

// A kernel that holds `ctas` SMs for a while: one CTA of 32 threads each,
// with all the shared memory a CTA may have, so that no CTA of another kernel
// fits beside it, spinning on %globaltimer; each CTA counts itself in
// host-mapped memory as it starts. The GPU suite is plain C++, so it comes
// as PTX through the driver API (its entry points through the runtime, as
// the library's own: no link to libcuda).
constexpr const char* kSpinPtx = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry muse_decode_test_spin(.param .u64 spin_ns, .param .u64 started)
{
  .reg .pred %p<3>;
  .reg .b32 %r<3>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [spin_ns];
  ld.param.u64 %rd2, [started];
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra SPIN;
  atom.sys.add.u32 %r2, [%rd2], 1;
SPIN:
  mov.u64 %rd3, %globaltimer;
LOOP:
  mov.u64 %rd4, %globaltimer;
  sub.u64 %rd5, %rd4, %rd3;
  setp.lt.u64 %p2, %rd5, %rd1;
  @%p2 bra LOOP;
  ret;
}
)";

template <typename Fn>
Fn driver_entry(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(f);
}

class SpinKernel {
 public:
  SpinKernel() {
    load_ = driver_entry<PFN_cuModuleLoadData_v2000>("cuModuleLoadData", 2000);
    unload_ = driver_entry<PFN_cuModuleUnload_v2000>("cuModuleUnload", 2000);
    get_ = driver_entry<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction", 2000);
    set_ = driver_entry<PFN_cuFuncSetAttribute_v9000>("cuFuncSetAttribute", 9000);
    launch_ = driver_entry<PFN_cuLaunchKernel_v4000>("cuLaunchKernel", 4000);
    if (!load_ || !unload_ || !get_ || !set_ || !launch_) {
      error = "the driver lacks an entry point of the module API";
      return;
    }
    cudaFree(nullptr);  // the runtime's primary context, current on this thread
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&smem_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    CUresult r = load_(&module_, kSpinPtx);
    if (r == CUDA_SUCCESS) r = get_(&fn_, module_, "muse_decode_test_spin");
    if (r == CUDA_SUCCESS) r = set_(fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_);
    if (r != CUDA_SUCCESS) error = "loading the spin kernel's PTX failed: CUresult " + std::to_string(r);
    if (cudaHostAlloc(reinterpret_cast<void**>(&started_), 4, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&started_dev_), started_, 0) != cudaSuccess)
      error = "cudaHostAlloc of a mapped word failed";
  }
  ~SpinKernel() {
    if (module_) unload_(module_);
    if (started_) cudaFreeHost(started_);
  }
  SpinKernel(const SpinKernel&) = delete;
  SpinKernel& operator=(const SpinKernel&) = delete;

  // Launches `ctas` CTAs spinning for `ns` nanoseconds on `stream`.
  bool launch(int ctas, unsigned long long ns, cudaStream_t stream) {
    *started_ = 0;
    void* started = started_dev_;
    void* params[] = {&ns, &started};
    return launch_(fn_, ctas, 1, 1, 32, 1, 1, smem_, stream, params, nullptr) == CUDA_SUCCESS;
  }
  // CTAs of the last launch that have started.
  unsigned started() const { return *static_cast<volatile unsigned*>(started_); }

  std::string error;  // empty when the kernel is ready

 private:
  PFN_cuModuleLoadData_v2000 load_ = nullptr;
  PFN_cuModuleUnload_v2000 unload_ = nullptr;
  PFN_cuModuleGetFunction_v2000 get_ = nullptr;
  PFN_cuFuncSetAttribute_v9000 set_ = nullptr;
  PFN_cuLaunchKernel_v4000 launch_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction fn_ = nullptr;
  int smem_ = 0;
  unsigned* started_ = nullptr;
  unsigned* started_dev_ = nullptr;
};

}  // namespace

TEST_F(AttentionBlockGpu, ServesTp8AndTp4) {
  EXPECT_TRUE(md::attention_block_supports_kv_heads(2));
  EXPECT_TRUE(md::attention_block_supports_kv_heads(4));
  for (int kvh : {2, 4})
    for (int window : {0, 2048}) {
      EXPECT_EQ(md::attention_block_splits(8, kvh, kMaxLen, window), impl::splits_of(8, kvh, kMaxLen, window));
      EXPECT_GE(md::attention_block_workspace_bytes(8, kvh, kMaxLen, window),
                impl::workspace_layout(8, kvh, impl::splits_of(8, kvh, kMaxLen, window)).total);
    }
}

// The tests' oracle, the reference's steps over the host's cores, is
// reference::attention_block_exact: the same rows, cache and sums (on a
// small step: the reference runs on one core).
TEST_F(AttentionBlockGpu, TheOracleIsTheReference) {
  const int kvh = 4;
  const bool sliding = true;
  Problem p(weights(kvh), {9, 2100}, 4096, sliding, 3);
  const Expected e = p.reference();
  md::reference::AttentionBlockInputs in;
  std::vector<uint16_t> cache = p.cache, qkv(static_cast<size_t>(p.T) * p.n);
  in.x = p.x.data();
  in.x_stride = kXStride;
  in.num_reqs = p.reqs;
  in.qkv_weight = p.w.w_qkv.data();
  in.num_kv_heads = kvh;
  in.positions = p.positions.data();
  in.cos_sin = sliding ? p.w.cos_sin.data() : nullptr;
  in.max_pos = kMaxLen;
  in.slot_mapping = p.slots.data();
  in.kv_cache = cache.data();
  in.num_pages = p.num_pages;
  in.block_table = p.table.data();
  in.block_table_stride = p.max_pages;
  in.seq_lens = p.lens.data();
  in.window = p.window;
  in.o_proj_weight = p.w.w_o.data();
  md::reference::AttentionBlockSteps steps;
  steps.qkv = qkv.data();
  std::vector<double> y(static_cast<size_t>(p.T) * kHidden);
  md::reference::attention_block_exact(in, y.data(), steps);
  EXPECT_TRUE(qkv == e.qkv_bf) << "the projection rows differ";
  EXPECT_TRUE(cache == e.cache) << "the caches after the insert differ";
  double worst = 0.0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - e.out[i]));
  EXPECT_LE(worst, 1e-9) << "o_proj's sums differ";
}

// TP8 and TP4, full layers and the sliding window (RoPE), 1, 2, 3 and 8
// requests of odd lengths at max_model_len 32768.
TEST_F(AttentionBlockGpu, MatchesTheChainAndTheReference) {
  const std::vector<std::vector<int>> steps = {
      {32768}, {8}, {9, 2049}, {17, 2047, 5000}, {8, 9, 17, 2047, 2049, 5000, 32768, 100}};
  uint64_t seed = 1;
  for (int kvh : {2, 4})
    for (bool sliding : {false, true})
      for (const auto& lens : steps) {
        if (kvh == 4 && sliding && lens.size() < 8) continue;  // TP4's window: the mixed step of 8 requests
        Problem p(weights(kvh), lens, kMaxLen, sliding, seed++);
        p.run_and_check(sliding ? "sliding" : "full");
        if (HasFailure()) return;
      }
}

// One graph of one call, replayed over new steps written into the same
// buffers: new lengths (and so new positions and slots), new block tables
// over the same pool of pages, new x and cache contents. A second replay of
// the same step gives the same bits.
TEST_F(AttentionBlockGpu, GraphReplayWithNewLengthsAndPositions) {
  for (bool sliding : {false, true}) {
    const int mml = 4096;
    SCOPED_TRACE(::testing::Message() << (sliding ? "sliding" : "full") << ", max_model_len " << mml);
    Problem p(weights(2), {mml, mml, mml}, mml, sliding, 31 + sliding);  // pages for any later length
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(p.stream, cudaStreamCaptureModeGlobal));
    md::attention_block(p.args(), p.st());
    CUDA_OK(cudaStreamEndCapture(p.stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    SplitMix pick{77};
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(::testing::Message() << "replay " << round);
      std::vector<int> lens(3);
      for (int& L : lens) L = round == 0 ? mml : 8 + pick.below(mml - 7);
      p.new_step(lens);
      const Expected e = p.reference();
      p.poison();
      CUDA_OK(cudaGraphLaunch(exec, p.stream));
      CUDA_OK(cudaStreamSynchronize(p.stream));
      const auto out = p.d_out->download();
      const double worst = p.check_out(out, e);
      p.check_cache(p.check_workspace(), e);
      CUDA_OK(cudaGraphLaunch(exec, p.stream));
      CUDA_OK(cudaStreamSynchronize(p.stream));
      ASSERT_EQ(p.d_out->download(), out) << "a second replay of the same step differs";
      std::printf("[ attn_block ] graph replay %d (%s): L %d, %d, %d: max rel RMS per row %.2e\n", round,
                  sliding ? "sliding" : "full", lens[0], lens[1], lens[2], worst);
      if (HasFailure()) break;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// Three runs of one step give the same bits of out and of the cache, and
// leave the counters at zero each time; so do the unchecked launch on grids
// of other sizes (the work is cut into fixed shares, whichever CTA runs
// them) and the bound form.
TEST_F(AttentionBlockGpu, SameBitsOverRunsGridsAndTheBoundForm) {
  for (bool sliding : {false, true}) {
    SCOPED_TRACE(sliding ? "sliding" : "full");
    Problem p(weights(2), {16389, 9, 5000}, kMaxLen, sliding, 41 + sliding);
    const Expected e = p.reference();
    std::vector<uint16_t> first, first_cache;
    for (int run = 0; run < 3; ++run) {
      SCOPED_TRACE(::testing::Message() << "run " << run);
      const auto out = p.run_block();
      p.check_workspace();
      const auto cache = p.d_cache->download();
      if (run == 0) {
        p.check_out(out, e);
        first = out;
        first_cache = cache;
      } else {
        ASSERT_EQ(out, first) << "out bits differ";
        ASSERT_EQ(cache, first_cache) << "cache bits differ";
      }
    }
    int grid = 0;
    CUDA_OK(static_cast<cudaError_t>(impl::set_kernel_attributes(&grid)));
    ASSERT_GT(grid, 0);
    for (int g : {grid, std::max(1, grid / 2), 7}) {
      SCOPED_TRACE(::testing::Message() << "grid " << g);
      p.poison();
      CUDA_OK(static_cast<cudaError_t>(impl::launch(impl::params_of(p.args(), g), p.st())));
      CUDA_OK(cudaStreamSynchronize(p.stream));
      ASSERT_EQ(p.d_out->download(), first) << "the unchecked launch's bits differ";
      p.check_workspace();
    }
    const md::AttentionBlockArgs a = p.args();
    const md::AttentionBlock bound(a.qkv_weight, a.cos_sin, a.kv_cache, a.num_kv_heads, a.o_proj_weight,
                                   a.max_model_len, a.window, a.workspace);
    p.poison();
    bound(a.x, a.positions, a.slot_mapping, a.block_table, a.seq_lens, a.out, p.st());
    CUDA_OK(cudaStreamSynchronize(p.stream));
    ASSERT_EQ(p.d_out->download(), first) << "the bound form's bits differ";
    ASSERT_EQ(p.d_cache->download(), first_cache) << "the bound form's cache differs";
  }
}

// Request 0: L < 8; request 1: L > max_model_len; request 2: a page id
// outside the cache among its pages; request 3: valid, with its first token's
// slot outside the cache (no insert: its key is read as the cache holds it).
// Their rows are NaN but request 3's; every slot inside the cache still gets
// its insert. The next launch on the same workspace finds it ready.
TEST_F(AttentionBlockGpu, ContractBreaksGiveNaNRows) {
  const int mml = 8192;
  Problem p(weights(2), {16, mml, 1500, 900}, mml, false, 51);
  p.lens = {5, mml + 1, 1500, 900};
  p.table[2 * p.max_pages + 50] = p.num_pages + 7;
  const int64_t kept = p.slots[3 * 8];  // request 3's first token: its row keeps random values
  p.slots[3 * 8] = static_cast<int64_t>(p.num_pages) * 16 + 5;
  for (int kv = 0; kv < p.kvh; ++kv)
    for (int d = 0; d < 128; ++d) p.cache[p.slot_row(kept, kv) + d] = bf16(p.rng.uniform());
  p.upload();
  {
    SCOPED_TRACE("contract breaks");
    const Expected e = p.reference({0, 1, 2});
    p.check_out(p.run_block(), e, {0, 1, 2});
    p.check_cache(p.check_workspace(), e);
  }
  p.new_step({16, 2000, 1500, 900});
  p.table[2 * p.max_pages + 50] = -3;
  p.upload();
  {
    SCOPED_TRACE("the next launch");
    const Expected e = p.reference({2});
    p.check_out(p.run_block(), e, {2});
    p.check_cache(p.check_workspace(), e);
  }
}

// Another stream's kernel holds all but 12 SMs for 40 ms when the block is
// launched: the cooperative launch must wait for it, neither hang (the test
// gives up after 20 s and ends the process) nor fail, and compute the same.
TEST_F(AttentionBlockGpu, WaitsForAKernelHoldingMostSms) {
  SpinKernel spin;
  ASSERT_TRUE(spin.error.empty()) << spin.error;
  Problem p(weights(2), {5000, 2049}, kMaxLen, false, 61);
  const Expected e = p.reference();
  p.poison();
  cudaStream_t other;
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  const int ctas = std::max(1, md::sm_count() - 12);
  ASSERT_TRUE(spin.launch(ctas, 40'000'000ull, other));
  const auto t0 = std::chrono::steady_clock::now();
  while (spin.started() < static_cast<unsigned>(ctas) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::yield();
  ASSERT_EQ(spin.started(), static_cast<unsigned>(ctas)) << "the spin kernel's CTAs did not all start";
  md::attention_block(p.args(), p.st());
  EXPECT_EQ(cudaStreamQuery(other), cudaErrorNotReady) << "the spin kernel ended before the block was launched";
  cudaError_t done;
  while ((done = cudaStreamQuery(p.stream)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      std::fprintf(stderr, "attention_block did not finish within 20 s of a kernel holding %d SMs: it hangs\n", ctas);
      std::fflush(nullptr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cudaGetLastError();  // the polls' "not ready" is no error of a later call
  CUDA_OK(done);
  CUDA_OK(cudaStreamSynchronize(other));
  cudaStreamDestroy(other);
  const double worst = p.check_out(p.d_out->download(), e);
  p.check_cache(p.check_workspace(), e);
  std::printf("[ attn_block ] behind a kernel holding %d SMs for 40 ms: done after %.1f ms, max rel RMS per row %.2e\n",
              ctas, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), worst);
}

// Refused calls throw std::invalid_argument with the text the why-not check
// returns, before anything is launched.
TEST_F(AttentionBlockGpu, BadInputLaunchesNothing) {
  Problem p(weights(2), {3000}, 8192, false, 71);
  p.poison();
  const md::AttentionBlockArgs good = p.args();
  const auto why_good = md::unsupported_attention_block_call(good);
  EXPECT_FALSE(why_good.has_value()) << *why_good;
  EXPECT_TRUE(md::attention_block_supports_call(good));
  EXPECT_NO_THROW(md::check_attention_block(good));
  std::vector<md::AttentionBlockArgs> bad(4, good);
  bad[0].x.shape[0] = 72;  // 9 requests
  bad[0].out.shape[0] = 72;
  bad[1].out.data = p.d_x->get();  // out over x
  bad[2].workspace.shape[0] = 16;
  bad[3].seq_lens.dtype = DType::kInt64;
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "bad call " << i);
    const auto why = md::unsupported_attention_block_call(bad[i]);
    ASSERT_TRUE(why.has_value());
    EXPECT_EQ(md::testing::error_of([&] { md::attention_block(bad[i], p.st()); }), *why);
  }
  CUDA_OK(cudaStreamSynchronize(p.stream));
  for (uint16_t v : p.d_out->download()) ASSERT_EQ(v, kPoison) << "a refused call wrote out";
}
