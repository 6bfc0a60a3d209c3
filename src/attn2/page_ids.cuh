// The page ids a copying warp of attn2's key loops needs, one batch ahead of
// its copies: fill 0's pages (loaded with L, or before it), then batches of
// kFills fills of kPages pages each (32 lanes: lane -> fill b + lane /
// kPages, page lane % kPages), each batch loaded from the block table while
// the previous one is used, so that a copy never waits for a block-table
// load.
#pragma once

#include <cuda_runtime.h>

namespace muse_decode::attn2_impl {

template <int kPages>
struct PageIds {
  static constexpr int kFills = 32 / kPages;
  static_assert(kFills * kPages == 32, "a batch is one id per lane");

  int first = -1;  // (lanes 0 .. kPages - 1) fill 0's pages
  int cur = -1;    // the batch in use: fills 1 + kFills m ..
  int next = -1;   // the batch after it

  // (Every lane of the warp) this lane's page of fill j, loading the batch
  // after j's by load_batch(first fill of that batch) where j starts a batch.
  template <typename LoadBatch>
  __device__ __forceinline__ int of(int j, int lane, LoadBatch&& load_batch) {
    if (j == 0) return first;
    const int k = (j - 1) % kFills;
    if (k == 0) {
      cur = next;
      next = load_batch(j + kFills);
    }
    return __shfl_sync(0xFFFFFFFFu, cur, k * kPages + lane % kPages);
  }
};

}  // namespace muse_decode::attn2_impl
