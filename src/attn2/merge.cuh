// attn2's merges after the key loop, each in a fixed order so that the bits
// do not depend on timing:
//  1. the key halves: the second half's state into the first's, through
//     shared memory;
//  2. the cluster merge: CTA rank r owns rows [r * 64 / C, ...); every CTA
//     pushes those rows of its state into rank r's shared memory (st.async,
//     completing on rank r's mbarrier), and rank r's merger threads combine
//     the C states in rank order;
//  3. the split merge (launches with several slices): each slice's merged
//     rows go to the workspace (workspace.cuh), and one slice per (request,
//     KV head, rank) combines them in slice order.
//
// The cluster merge pushes instead of pulling: one one-way trip over the
// SM-to-SM network instead of a barrier round and a load round trip, and no
// cluster barrier before exit (nobody reads another CTA's shared memory). A
// CTA leaves its O in fp16, each row scaled by a power of 2 that brings its
// largest |O| into [1, 2) (exact; the row's 2^e travels beside m and l):
// 2^-11 relative to the row's largest value, whatever the magnitude of V.
// fp32 would be 16 KB per CTA, and the network moves ~15-20 bytes per clock
// and SM: attn2's pattern takes 1.1 us at 224 CTAs, 0.8 with half the bytes
// (bench/micro/dsmem.cu).
#pragma once

#include <cmath>

#include "../common/online_softmax.cuh"
#include "../common/ptx.cuh"
#include "config.cuh"
#include "rows.cuh"
#include "softmax.cuh"
#include "workspace.cuh"

namespace muse_decode::attn2_impl {

// ---- 1. the key halves ------------------------------------------------------------
// The exchange area: 9 float4 per thread of the second half (O, then m and
// l), thread-minor so that both sides are conflict-free.
__device__ __forceinline__ void stash_second_half(const SoftmaxState& st, float4* xchg) {
  const int t = threadIdx.x - kHalfThreads;
#pragma unroll
  for (int n = 0; n < 8; ++n) xchg[n * kHalfThreads + t] = make_float4(st.o[n][0], st.o[n][1], st.o[n][2], st.o[n][3]);
  xchg[8 * kHalfThreads + t] = make_float4(st.m[0], st.m[1], st.l[0], st.l[1]);
}
__device__ __forceinline__ void merge_second_half(SoftmaxState& st, const float4* xchg) {
  const float4 ml = xchg[8 * kHalfThreads + threadIdx.x];
  const float m1[2] = {ml.x, ml.y}, l1[2] = {ml.z, ml.w};
  st.merge(m1, l1, [&](int n) { return xchg[n * kHalfThreads + threadIdx.x]; });
}

// A merged row's piece in one thread: its kCols columns of unnormalised O,
// relative to m (log2 domain: the merges' scale is 1), and the softmax sum l.
template <int kCols>
using MergedRow = softmax::State<kCols>;

// ---- 2. the cluster merge ------------------------------------------------------------
// A CTA opens its receive area to the other ranks' pushes with a relaxed
// cluster arrival once its stages are consumed. It must publish the receive
// mbarrier's init, which fence_mbarrier_init already released (the PTX
// ISA's pattern), and this CTA's reads of the stage under the receive area
// have all returned by then (wgmma waited for, ldmatrix results consumed).
// The release form is a MEMBAR.ALL.GPU per thread on the chain after the key
// loop (TP8 32k 0.3 us, 128k 0.4).
// 16 bytes into CTA `rank`'s shared memory at this CTA's address `addr` of
// the same spot, completing on that CTA's mbarrier at (this CTA's address) `bar`.
__device__ __forceinline__ void push_to_rank(uint32_t addr, uint4 v, uint32_t bar, int rank) {
  ptx::st_async_v4(ptx::map_to_rank(addr, rank), v, ptx::map_to_rank(bar, rank));
}

// The receive area (config.cuh: kRecvOffset): per (source rank, owned row)
// 64 halves of O, then per (rank, row) a float4 (m in the log2 domain, l,
// 2^e, -).
template <int kCluster>
struct ClusterMerge {
  using Rows = RowOwner<kCluster>;
  static constexpr int kMergeRows = Rows::kMergeRows;
  static constexpr bool kRegPush = Rows::kRegPush;

  uint32_t ho[2][8];  // (kRegPush) rows r: fp16 pairs of O * 2^-e, n-tile n
  float4 mls[2];      // (kRegPush) rows r: m (log2 domain), l, 2^e

  // (First half) this warp's rows of the CTA's state, O in fp16 scaled by the
  // row's 2^-e (e: the exponent of its largest |O|, clamped to the normal
  // range): into registers (kRegPush) or the fp16 merge area and s_mls.
  __device__ __forceinline__ void encode(const SoftmaxState& st, int rw, int lane, __half* merge_o,
                                         float4* s_mls) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + r * 8 + lane / 4;  // = head * 8 + token
      float mx = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(fabsf(st.o[n][2 * r]), fabsf(st.o[n][2 * r + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      const int e = mx > 0.0f ? min(127, max(-126, static_cast<int>((__float_as_uint(mx) >> 23) & 0xFF) - 127)) : 0;
      const float down = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
      const float up = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
      if constexpr (kRegPush) {
#pragma unroll
        for (int n = 0; n < 8; ++n) ho[r][n] = ptx::pack_half(st.o[n][2 * r] * down, st.o[n][2 * r + 1] * down);
        mls[r] = make_float4(st.m[r] * kScaleLog2, st.l[r], up, 0.0f);
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<__half2*>(merge_o + row * kMergeStrideH + n * 8 + (lane % 4) * 2) =
              __floats2half2_rn(st.o[n][2 * r] * down, st.o[n][2 * r + 1] * down);
        if (lane % 4 == 0) s_mls[row] = make_float4(st.m[r] * kScaleLog2, st.l[r], up, 0.0f);
      }
    }
  }

  // Every CTA's rows to their owners' receive areas (recv: this CTA's address
  // of it, bar: of the receive mbarrier; the same offsets in every CTA).
  // kRegPush: the first half pushes its registers, row r to rank r /
  // kMergeRows at slot (source rank, r % kMergeRows): the 2 x 16 bytes of
  // lane quad q (halves h = 0, 1), then (q = 0) m, l, 2^e. Otherwise every
  // thread pushes 16-byte chunks of the merge area.
  __device__ __forceinline__ void push(int rank, int rw, int kh, int lane, uint32_t recv, uint32_t bar,
                                       const __half* own_o, const float4* s_mls) const {
    if constexpr (kRegPush) {
      if (kh != 0) return;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rw * 16 + r * 8 + lane / 4;
        const int to = row / kMergeRows, slot = rank * kMergeRows + row % kMergeRows;
        // Half h at h kRecvHalfBytes + 64 slot + 16q: a warp's 8 rows go out
        // as two runs of 256 contiguous bytes.
        const uint32_t at = recv + slot * 64 + (lane % 4) * 16;
        push_to_rank(at, make_uint4(ho[r][0], ho[r][1], ho[r][2], ho[r][3]), bar, to);
        push_to_rank(at + Rows::kRecvHalfBytes, make_uint4(ho[r][4], ho[r][5], ho[r][6], ho[r][7]), bar, to);
        if (lane % 4 == 0)
          push_to_rank(recv + kRows * kHeadDim * 2 + slot * 16,
                       make_uint4(__float_as_uint(mls[r].x), __float_as_uint(mls[r].y), __float_as_uint(mls[r].z),
                                  __float_as_uint(mls[r].w)),
                       bar, to);
      }
    } else {
      // Row r to rank r / kMergeRows, at (source rank, r % kMergeRows): 8
      // chunks of 16 bytes of O per row, then one of m, l, 2^e.
      static_assert(kRows * 8 % kThreads == 0, "whole rounds of chunks");
#pragma unroll
      for (int i = 0; i < kRows * 8 / kThreads; ++i) {
        const int c = threadIdx.x + i * kThreads;
        const int r = c / 8, q = c % 8;
        const uint4 v = *reinterpret_cast<const uint4*>(own_o + r * kMergeStrideH + q * 8);
        push_to_rank(recv + ((rank * kMergeRows + r % kMergeRows) * kHeadDim + q * 8) * 2, v, bar, r / kMergeRows);
      }
      if (threadIdx.x < kRows) {
        const int r = threadIdx.x;
        const float4 v = s_mls[r];
        push_to_rank(recv + kRows * kHeadDim * 2 + (rank * kMergeRows + r % kMergeRows) * 16,
                     make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)),
                     bar, r / kMergeRows);
      }
    }
  }

  // (Merger threads, once the receive barrier's phase 0 completed) the C
  // ranks' pieces of this thread's row, combined in rank order into row.
  // Each thread loads every rank's (m, l, 2^e) and computes every weight
  // itself (shuffling them from the row's lanes put 32 more shuffles on the
  // chain).
  __device__ __forceinline__ void combine(const Rows& rows, const uint8_t* recv_area,
                                          MergedRow<Rows::kCols>& row) const {
    constexpr int kCols = Rows::kCols;
    const int rr = threadIdx.x / Rows::kRowThreads;  // row % kMergeRows
    const int d = rows.d;
    const __half* rcv_o = reinterpret_cast<const __half*>(recv_area);
    const float4* rcv_mls = reinterpret_cast<const float4*>(recv_area + kRows * kHeadDim * 2) + rr;
    float ok[kCluster][kCols];
#pragma unroll
    for (int k = 0; k < kCluster; ++k) {
      // (kRegPush: position d lies in half d / 32, at d % 32 of slot (k, rr):
      // (h C + k) 64 / C + rr = h kRows + slot runs of 32 halves, kRecvHalfBytes apart)
      const __half* at = kRegPush ? rcv_o + ((d / 32 * kCluster + k) * kMergeRows + rr) * 32 + d % 32
                                  : rcv_o + (k * kMergeRows + rr) * kHeadDim + d;
      if constexpr (kCols == 4) {
        const uint2 h = *reinterpret_cast<const uint2*>(at);
        const float2 a = ptx::unpack_half(h.x), b = ptx::unpack_half(h.y);
        ok[k][0] = a.x, ok[k][1] = a.y, ok[k][2] = b.x, ok[k][3] = b.y;
      } else {
        const float2 v = ptx::unpack_half(*reinterpret_cast<const uint32_t*>(at));
        ok[k][0] = v.x, ok[k][1] = v.y;
      }
    }
    float4 v[kCluster];
#pragma unroll
    for (int k = 0; k < kCluster; ++k) v[k] = rcv_mls[k * kMergeRows];
    float mx[8];  // the max as a tree, log2(C) deep
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (kCluster == 16)
        mx[k] = fmaxf(v[k].x, v[k + 8].x);
      else
        mx[k] = v[k].x;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) mx[k] = fmaxf(mx[k], mx[k + 4]);
#pragma unroll
    for (int k = 0; k < 2; ++k) mx[k] = fmaxf(mx[k], mx[k + 2]);
    const float ref = row.start_at(fmaxf(mx[0], mx[1]));
    // Rank k's O weight: its softmax weight times its row's 2^e.
#pragma unroll
    for (int k = 0; k < kCluster; ++k) row.add(softmax::weight(v[k].x, ref, 1.0f), v[k].y, ok[k], v[k].z);
  }
};

// ---- 3. the split merge ---------------------------------------------------------------
// Every slice publishes its merged rows (ws_store: each word marks itself
// written). With tickets, thread 0 then takes one with a relaxed add,
// unordered with the stores (no wait for them to land), and the CTA with the
// last ticket merges its rank's rows, reading the others' words again until
// all are written: it only ever waits for CTAs that took their ticket before
// it, which have issued their stores and wait for nothing else (no deadlock,
// whatever the grid's waves). Where the whole grid is co-resident (host:
// p.resident), the last active slice merges without a ticket, polling the
// others' words until they are written (one L2 round trip sooner; it waits
// only for CTAs that wait for nothing, all on the GPU beside it). At 8k it
// holds the step's newest keys (copied after the wait) and so tends to finish
// last (0.05-0.1 us before slice 0 there).
template <int kCols>
struct SplitMerge {
  // 8 slices per round (all loads in flight at once; 16 would spill); the
  // mma.sync path holds more registers.
  static constexpr int kRound = kWgmma ? 8 : 4;

  const SplitWorkspace& ws;
  int active, split, row, d;

  __device__ __forceinline__ void publish(const MergedRow<kCols>& mine) const {
    const int64_t at = ws.at(split, row);
    if (d == 0) ws_store<2>(reinterpret_cast<float*>(&ws.ml[at]), {mine.m, mine.l});
    ws_store<kCols>(&ws.o[at * kHeadDim + d], mine.o);
  }

  // Thread 0's ticket on the (pair, rank) counter; true in every thread of
  // the CTA that took the last one, which resets the counter for the next
  // launch (that one reads it after its griddepcontrol.wait).
  __device__ __forceinline__ bool last_ticket() const {
    bool got_last = false;
    if (threadIdx.x == 0) {
      const int ticket = ptx::atom_add_relaxed_gpu(ws.counter, 1);
      got_last = ticket == active - 1;
      if (got_last) *ws.counter = 0;
    }
    return __syncthreads_or(got_last) != 0;
  }

  // (Merger threads of the merging CTA) every slice's partial of this
  // thread's row in slice order, this CTA's own (mine) from registers: each
  // round's words read until all are written, cleared for the next launch,
  // then merged, the round's largest m first (exact in any order), the sums
  // in slice order.
  __device__ __forceinline__ MergedRow<kCols> merge(const MergedRow<kCols>& mine) const {
    MergedRow<kCols> all;
    for (int z0 = 0; z0 < active; z0 += kRound) {
      uint2 ml[kRound];
      uint32_t ov[kRound][kCols];
      for (;;) {
        bool written = true;
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
          const int z = z0 + k;
          if (z < active && z != split) {
            const int64_t at = ws.at(z, row);
            ml[k] = ptx::ld_relaxed_gpu_v2(&ws.ml[at]);
            ws_load<kCols>(&ws.o[at * kHeadDim + d], ov[k]);
            written = written && ml[k].x != 0u && ml[k].y != 0u;
#pragma unroll
            for (int c = 0; c < kCols; ++c) written = written && ov[k][c] != 0u;
          }
        }
        if (__all_sync(0xFFFFFFFFu, written)) break;  // the merger warps are whole (rows of 16 or 32 lanes)
      }
      // The round's slots back to "not written" now, so that these stores
      // drain while the merge and the output run.
#pragma unroll
      for (int k = 0; k < kRound; ++k) {
        const int z = z0 + k;
        if (z < active) {
          const int64_t at = ws.at(z, row);
          if (d == 0) ws_clear<2>(reinterpret_cast<float*>(&ws.ml[at]));
          ws_clear<kCols>(&ws.o[at * kHeadDim + d]);
        }
      }
      MergedRow<kCols> part[kRound];
      float m_round = all.m;
#pragma unroll
      for (int k = 0; k < kRound; ++k) {
        const int z = z0 + k;
        const bool own = z == split;
        part[k].m = own ? mine.m : ws_value(ml[k].x);
        part[k].l = own ? mine.l : ws_value(ml[k].y);
#pragma unroll
        for (int c = 0; c < kCols; ++c) part[k].o[c] = own ? mine.o[c] : ws_value(ov[k][c]);
        if (z < active) m_round = fmaxf(m_round, part[k].m);
      }
      const float ref = all.take_max(m_round, 1.0f);
#pragma unroll
      for (int k = 0; k < kRound; ++k)
        if (z0 + k < active) all.add(softmax::weight(part[k].m, ref, 1.0f), part[k].l, part[k].o);
    }
    return all;
  }
};

}  // namespace muse_decode::attn2_impl
