// CPU reference of route: the contract (docs/contract.md) written out step by step.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "muse_decode/reference/route.h"

namespace muse_decode::reference {

// Step 3's order: NaN above every number, then larger keys, then lower index.
static bool ranks_before(float a, int ia, float b, int ib) {
  const bool an = std::isnan(a), bn = std::isnan(b);
  if (an != bn) return an;
  if (!an && a != b) return a > b;
  return ia < ib;
}

void route(const float* logits, int num_tokens, const float* bias, float route_scale,
           int32_t* ids, float* weights) {
  for (int t = 0; t < num_tokens; ++t) {
    const float* x = logits + static_cast<size_t>(t) * kNumExperts;
    float s[kNumExperts], key[kNumExperts];
    for (int e = 0; e < kNumExperts; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-x[e]));  // step 1 (host expf)
      key[e] = s[e] + bias[e];                   // step 2
    }
    int order[kNumExperts];
    std::iota(order, order + kNumExperts, 0);
    std::stable_sort(order, order + kNumExperts,
                     [&](int a, int b) { return ranks_before(key[a], a, key[b], b); });
    float sum = s[order[0]];
    for (int k = 1; k < kTopK; ++k) sum = sum + s[order[k]];  // step 4: left to right
    for (int k = 0; k < kTopK; ++k) {
      ids[t * kTopK + k] = order[k];
      weights[t * kTopK + k] = (s[order[k]] * route_scale) / (sum + kRouteDivisionEps);  // step 5
    }
  }
}

void routing_metadata(const int32_t* ids, int num_tokens, int offset, int count_local, int tile_n,
                      int32_t* md) {
  const int routes = num_tokens * kTopK;
  std::vector<int> count(count_local, 0), ncta(count_local, 0), cta_off(count_local, 0);
  for (int r = 0; r < routes; ++r) {
    const int j = ids[r] - offset;
    if (j >= 0 && j < count_local) ++count[j];
  }
  int ctas = 0;
  for (int j = 0; j < count_local; ++j) {
    ncta[j] = (count[j] + tile_n - 1) / tile_n;
    cta_off[j] = ctas;
    ctas += ncta[j];
  }
  md[kMetaNumCtas] = ctas;
  md[kMetaPaddedTokens] = ctas * tile_n;
  for (int j = 0; j < count_local; ++j) {
    for (int c = 0; c < ncta[j]; ++c) {
      const int g = cta_off[j] + c;
      md[kMetaCtaBatch + g] = j;
      md[kMetaCtaLimit + g] = std::min((g + 1) * tile_n, cta_off[j] * tile_n + count[j]);
    }
  }
  int32_t* permuted = md + kMetaPermutedToToken;
  for (int p = 0; p < ctas * tile_n; ++p) permuted[p] = -1;
  // Routes of each local expert in token order (t ascending, then k).
  std::vector<int> seen(count_local, 0);
  for (int r = 0; r < routes; ++r) {
    const int j = ids[r] - offset;
    if (j < 0 || j >= count_local) {
      md[kMetaExpandedToPermuted + r] = -1;
      continue;
    }
    const int p = cta_off[j] * tile_n + seen[j]++;
    md[kMetaExpandedToPermuted + r] = p;
    permuted[p] = r / kTopK;
  }
}

}  // namespace muse_decode::reference
