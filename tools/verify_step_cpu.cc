// The CPU reference path of the main job: each op's CPU reference on a small
// shape, checked against the formulas computed directly here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "muse_decode/reference.h"
#include "verify_step.h"

namespace muse_decode::tool {
namespace {

OpResult check_route() {
  std::mt19937 rng(42);
  const int rows = 64, tile = 16, local = 32;
  std::normal_distribution<float> nl(0.0f, 2.0f), nb(0.0f, 0.02f);
  std::vector<float> logits(rows * 256), bias(256);
  for (auto& v : logits) v = nl(rng);
  for (auto& v : bias) v = nb(rng);
  std::vector<int32_t> ids(rows * 8);
  std::vector<float> w(rows * 8);
  reference::route(logits.data(), rows, bias.data(), 1.0f, ids.data(), w.data());
  int bad = 0;
  for (int t = 0; t < rows; ++t) {
    double s[256], key[256], sum = 0, last = 1e300;
    for (int e = 0; e < 256; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-double(logits[t * 256 + e])));
      key[e] = s[e] + bias[e];
    }
    for (int k = 0; k < 8; ++k) sum += s[ids[t * 8 + k]];
    for (int k = 0; k < 8; ++k) {
      const int id = ids[t * 8 + k];
      bad += key[id] > last + 1e-7;                          // slots in descending key order
      bad += std::fabs(w[t * 8 + k] - s[id] / sum) > 1e-6;   // weights: score / sum
      last = key[id];
    }
    for (int e = 0; e < 256; ++e)  // nothing left out ranks above the 8th
      bad += key[e] > last + 1e-6 && std::find(&ids[t * 8], &ids[t * 8 + 8], e) == &ids[t * 8 + 8];
  }
  std::vector<int32_t> meta(metadata_size(tile), 0x7eadbeef);
  reference::routing_metadata(ids.data(), 8, 0, local, tile, meta.data());
  int routed = 0;
  for (int r = 0; r < 64; ++r) {
    const int p = meta[kMetaExpandedToPermuted + r];
    if (ids[r] < local) {
      ++routed;
      bad += p < 0 || meta[kMetaPermutedToToken + p] != r / 8;
    } else {
      bad += p != -1;
    }
  }
  bad += meta[kMetaPaddedTokens] != meta[kMetaNumCtas] * tile;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d rows routed against the formula in double, %d local routes in the metadata", rows, routed);
  return {"route", bad == 0, buf};
}

OpResult check_qkv_front() {
  std::mt19937 rng(7);
  const int t = 2, kvh = 1, n = qkv_width(kvh), heads = 8;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(t * kHiddenSize), w(size_t(n) * kHiddenSize);
  for (auto& v : x) v = reference::float_to_bf16_bits(nd(rng));
  for (auto& v : w) v = reference::float_to_bf16_bits(0.02f * nd(rng));
  std::vector<float> cs(16 * 64);
  for (int p = 0; p < 16; ++p)
    for (int j = 0; j < 32; ++j) {
      cs[p * 64 + j] = float(std::cos(p * 0.1 * (j + 1)));
      cs[p * 64 + 32 + j] = float(std::sin(p * 0.1 * (j + 1)));
    }
  const int64_t pos[2] = {3, 11};
  std::vector<double> y(size_t(t) * n), proj(size_t(t) * n);
  reference::qkv_front(x.data(), kHiddenSize, t, w.data(), kvh, pos, cs.data(), 16, y.data());
  int bad = 0;
  for (int tok = 0; tok < t; ++tok) {
    for (int c = 0; c < n; ++c) {  // the projection, directly
      double s = 0;
      for (int k = 0; k < kHiddenSize; ++k)
        s += double(reference::bf16_bits_to_float(x[tok * kHiddenSize + k])) *
             reference::bf16_bits_to_float(w[size_t(c) * kHiddenSize + k]);
      proj[size_t(tok) * n + c] = s;
    }
    for (int h = 0; h < heads + kvh; ++h) {  // q/k heads: normed then rotated pair by pair
      const double* raw = &proj[size_t(tok) * n + h * 64];
      double ms = 0;
      for (int d = 0; d < 64; ++d) ms += raw[d] * raw[d] / 64;
      const double inv = 1.0 / std::sqrt(ms + 1e-5);
      for (int j = 0; j < 32; ++j) {
        const double c = cs[pos[tok] * 64 + j], s = cs[pos[tok] * 64 + 32 + j];
        const double a = raw[2 * j] * inv, b = raw[2 * j + 1] * inv;
        bad += std::fabs(y[size_t(tok) * n + h * 64 + 2 * j] - (a * c - b * s)) > 1e-9;
        bad += std::fabs(y[size_t(tok) * n + h * 64 + 2 * j + 1] - (a * s + b * c)) > 1e-9;
      }
    }
    for (int c = (heads + kvh) * 64; c < n; ++c)  // v and gate pass through
      bad += std::fabs(y[size_t(tok) * n + c] - proj[size_t(tok) * n + c]) > 1e-9;
  }
  return {"qkv_front", bad == 0, "2 tokens, 1 KV head: projection, norm and RoPE against the formulas in double"};
}

OpResult check_attn2() {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int L = 40, pages = 4;
  std::vector<uint16_t> q(8 * 512), gate(8 * 512), cache(size_t(pages) * 16 * 128);
  for (auto& v : q) v = reference::float_to_bf16_bits(nd(rng));
  for (auto& v : gate) v = reference::float_to_bf16_bits(nd(rng));
  for (auto& v : cache) v = reference::float_to_bf16_bits(nd(rng));
  const int32_t table[3] = {2, 0, 3}, lens[1] = {L};
  int bad = 0;
  for (int window : {0, 20}) {
    reference::Attn2Inputs in;
    in.q = q.data();
    in.q_stride = 512;
    in.gate = gate.data();
    in.gate_stride = 512;
    in.kv_cache = cache.data();
    in.num_kv_heads = 1;
    in.block_table = table;
    in.block_table_stride = 3;
    in.seq_lens = lens;
    in.window = window;
    std::vector<double> out(64 * 64);
    reference::attn2_pair(in, 0, 0, out.data());
    auto kv = [&](int j, int d) {
      return double(reference::bf16_bits_to_float(cache[(size_t(table[j / 16]) * 16 + j % 16) * 128 + d]));
    };
    for (int i = 0; i < 8; ++i)
      for (int g = 0; g < 8; ++g) {
        const int p = L - 8 + i, lo = window ? std::max(0, p - window + 1) : 0;
        std::vector<double> sc;
        double mx = -1e300;
        for (int j = lo; j <= p; ++j) {
          double s = 0;
          for (int d = 0; d < 64; ++d) s += double(reference::bf16_bits_to_float(q[i * 512 + g * 64 + d])) * kv(j, d);
          sc.push_back(0.6841258107984375 * s);
          mx = std::max(mx, sc.back());
        }
        double z = 0, o[64] = {};
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (int j = lo; j <= p; ++j)
          for (int d = 0; d < 64; ++d) o[d] += sc[j - lo] / z * kv(j, 64 + d);
        double ms = 0;
        for (double v : o) ms += v * v / 64;
        for (int d = 0; d < 64; ++d) {
          const double gt = reference::bf16_bits_to_float(gate[i * 512 + g * 64 + d]);
          const double want = o[d] / std::sqrt(ms + 1e-5) / (1.0 + std::exp(-gt));
          bad += std::fabs(out[(i * 8 + g) * 64 + d] - want) > 1e-9 * (1 + std::fabs(want));
        }
      }
  }
  return {"attn2", bad == 0, "1 request, L = 40 over shuffled pages, windows 0 and 20: against the formula in double"};
}

OpResult check_o_proj() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int t = 2, k = 8 * 64;                 // 2 rows of one KV head's 8 query heads
  const int64_t x_stride = k + 8, out_stride = kOProjOutWidth + 8;  // padded rows: left untouched
  std::vector<uint16_t> x(t * x_stride), w(size_t(kOProjOutWidth) * k);
  for (auto& v : x) v = reference::float_to_bf16_bits(nd(rng));
  for (auto& v : w) v = reference::float_to_bf16_bits(0.05f * nd(rng));
  const uint16_t kUntouched = 0x7fc1;          // a NaN the reference never writes
  std::vector<uint16_t> out(t * out_stride, kUntouched);
  reference::o_proj(x.data(), x_stride, t, w.data(), k, out.data(), out_stride);
  int bad = 0;
  double worst = 0;
  for (int tok = 0; tok < t; ++tok) {
    for (int n = 0; n < kOProjOutWidth; ++n) {  // out[t, n] = sum_k x[t, k] W[n, k], directly
      double exact = 0, magnitude = 0;
      for (int c = 0; c < k; ++c) {
        const double p = double(reference::bf16_bits_to_float(x[tok * x_stride + c])) *
                         reference::bf16_bits_to_float(w[size_t(n) * k + c]);
        exact += p;
        magnitude += std::fabs(p);
      }
      // One rounding to bf16 (half an ulp: 2^-9 of the value, at most 2^-8 of
      // it) after an fp32 sum of k products (k * 2^-24 of their magnitudes).
      const double got = reference::bf16_bits_to_float(out[tok * out_stride + n]);
      const double err = std::fabs(got - exact), tol = std::ldexp(std::fabs(exact), -8) + std::ldexp(magnitude * k, -23);
      bad += !(err <= tol);
      worst = std::max(worst, err / tol);
    }
    for (int64_t c = kOProjOutWidth; c < out_stride; ++c) bad += out[tok * out_stride + c] != kUntouched;
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "%d rows, K = %d, 8192 outputs: the fp32 sum rounded once to bf16 against the formula in double "
                "(largest error %.2f of its bound), row padding untouched",
                t, k, worst);
  return {"o_proj", bad == 0, buf};
}

}  // namespace

std::vector<OpResult> run_cpu() { return {check_qkv_front(), check_attn2(), check_o_proj(), check_route()}; }

}  // namespace muse_decode::tool
