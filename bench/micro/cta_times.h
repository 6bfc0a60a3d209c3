// Per-CTA timing of one launch, for dsmem.cu and dsmem_push.cu: CTA c stores
// its start and end (%globaltimer, ns) at out[2c] and out[2c + 1]; add() takes
// one launch's stamps and keeps, in us, the median CTA's end - start (each)
// and the span from the first start to the last end (span). A program prints
// the median of either over its launches (median()).
#pragma once

#include <algorithm>
#include <vector>

struct CtaTimes {
  std::vector<double> each, span;

  void add(const std::vector<unsigned long long>& h, int ctas) {
    unsigned long long first = ~0ull, last = 0;
    std::vector<double> e;
    for (int c = 0; c < ctas; ++c) {
      first = std::min(first, h[2 * c]);
      last = std::max(last, h[2 * c + 1]);
      e.push_back((h[2 * c + 1] - h[2 * c]) * 1e-3);
    }
    each.push_back(median(e));
    span.push_back((last - first) * 1e-3);
  }

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};
