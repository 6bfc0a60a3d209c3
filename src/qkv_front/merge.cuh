// The split-K merges: a head whose K was streamed by several CTAs is summed,
// in K order, by one of them, which then runs the epilogue.
// - Stream-K: through the workspace. Each CTA stores its partial; an integer
//   arrival counter per tile picks the last CTA to arrive, which adds all of
//   them in CTA (= K) order. About three L2 round trips after the last block
//   (store and fence, atomic, loads): at TP8 (H200, T = 1) 13.3 us with them
//   and the epilogue, 9.7 without; a small part of TP1's 72.
// - Cluster: through distributed shared memory. The other ranks push their
//   fp32 fragments into the owner's merge slots with st.async, completing on
//   the owner's mbarrier; the owner adds them in rank (= K) order. No
//   workspace, no arrival counter, no fence: TP8 T = 1 10.45 us against
//   13.46 for the stream-K kernel (H200).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"
#include "pipeline.cuh"
#include "schedule.cuh"

namespace muse_decode::qkv_front_impl {

// ---- stream-K: through the workspace ---------------------------------------------
// Workspace: one uint32 arrival counter per tile (padded to 256 bytes), then
// one partial of kFrontPartialBytes per (CTA, tile it touches), at slot tile +
// cta (a CTA's tiles follow its predecessor's last, so the slots are unique).
// Every launch leaves the counters at zero.
template <int NT>
struct WorkspaceMerge {
  static constexpr int kPartialFloat4 = kFrontPartialBytes / 16;
  uint32_t* counters;
  float4* partials;

  __device__ __forceinline__ WorkspaceMerge(void* workspace, int tiles)
      : counters(static_cast<uint32_t*>(workspace)),
        partials(reinterpret_cast<float4*>(static_cast<uint8_t*>(workspace) + counter_bytes(tiles))) {}

  __device__ __forceinline__ static int64_t counter_bytes(int tiles) { return (int64_t{tiles} * 4 + 255) / 256 * 256; }

  // The consumer threads with this CTA's sums of segment `seg` (not whole) in
  // acc: publishes them and returns whether this CTA is the tile's last to
  // arrive, acc then holding the tile's sums over all its CTAs. s_last: a
  // shared word.
  __device__ __forceinline__ bool sum_if_last(float (&acc)[NT][4], const StreamKWork& work, const Segment& seg,
                                              int* s_last, int tid) const {
    float4* mine = partials + int64_t{seg.tile + work.cta} * kPartialFloat4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      __stcg(&mine[tid * 2 + nt], make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]));
    // The cooperative-groups grid-sync pattern: the barrier orders the CTA's
    // stores before thread 0's fence and arrival, and the arrival that
    // completes the count orders every partial before the reads.
    sync_consumers();
    const int first = work.owner_of(seg.tile_begin), last = work.owner_of(seg.tile_end - 1);
    if (tid == 0) {
      __threadfence();
      const uint32_t arrived = atomicAdd(&counters[seg.tile], 1u);
      const int is_last = arrived == static_cast<uint32_t>(last - first);
      if (is_last) {
        counters[seg.tile] = 0u;  // ready for the next launch
        __threadfence();
      }
      *s_last = is_last;
    }
    sync_consumers();
    if (!*s_last) return false;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int c = first; c <= last; ++c) {
      const float4* part = partials + int64_t{seg.tile + c} * kPartialFloat4;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 v = __ldcg(&part[tid * 2 + nt]);
        acc[nt][0] += v.x;
        acc[nt][1] += v.y;
        acc[nt][2] += v.z;
        acc[nt][3] += v.w;
      }
    }
    return true;
  }
};

// ---- cluster: through distributed shared memory ---------------------------------------
// The owner's merge slots: [kClusterCtas - 1][128 consumer threads][NT]
// float4, slot r - 1 for rank r; `merged` completes once every other rank's
// partial has landed (the owner expects their bytes when it initialises it).
template <int NT>
struct ClusterMerge {
  static constexpr int kPartialFloats = ClusterLayout<NT>::kPartialBytes / 4;
  float* slots;
  uint64_t* merged;

  // Rank `rank` >= 1: this consumer thread's partial into slot rank - 1 of
  // the owner (rank 0), counted on the owner's barrier. The warp's 32 lanes
  // come here together (the .aligned cluster wait).
  __device__ __forceinline__ void push(const float (&acc)[NT][4], uint32_t rank, int tid) const {
    ptx::cluster_wait();  // the owner has started: its barrier is initialised
    const uint32_t slot = ptx::smem_addr(slots + (rank - 1) * kPartialFloats + tid * NT * 4);
    const uint32_t remote = ptx::map_to_rank(slot, 0), remote_bar = ptx::map_to_rank(ptx::smem_addr(merged), 0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      ptx::st_async_v4(remote + nt * 16,
                       make_uint4(__float_as_uint(acc[nt][0]), __float_as_uint(acc[nt][1]), __float_as_uint(acc[nt][2]),
                                  __float_as_uint(acc[nt][3])),
                       remote_bar);
  }

  // The owner: the other ranks' partials added to its own in rank (= K)
  // order. Ends with a consumer barrier: the slots may be rewritten after it.
  __device__ __forceinline__ void add(float (&acc)[NT][4], int tid) const {
    ptx::mbar_wait<true>(merged, 0);
    for (int c = 1; c < kClusterCtas; ++c) {
      const float4* part = reinterpret_cast<const float4*>(slots + (c - 1) * kPartialFloats) + tid * NT;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 v = part[nt];
        acc[nt][0] += v.x;
        acc[nt][1] += v.y;
        acc[nt][2] += v.z;
        acc[nt][3] += v.w;
      }
    }
    sync_consumers();  // every partial is read before the epilogue tile overwrites the slots
  }
};

}  // namespace muse_decode::qkv_front_impl
