// The micro-benchmarks' timing of one launch: CTA c stores its start and end
// (%globaltimer, ns) at out[2c] and out[2c + 1]. Per launch, the median CTA's
// end - start and the span from the first start to the last end; the median
// of either over the launches. In us.
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
