// attn2's key loop with mma.sync: sm_100a (no wgmma there) and, built with
// MUSE_ATTN2_SM90_MMA_SYNC, sm_90a.
//
// Loads: warp 0 also produces: it copies whole 4 KB (page, KV head) slots
// with cp.async.bulk, one 8-page group per stage (schedule.cuh's
// GroupSchedule), kStages stages, and issues group j + 3 into the stage all 8
// warps have just released. (A fifth, producer-only warp would cost the
// second CTA per SM: two CTAs of 5 warps put 3-4 warps on one SM
// sub-partition, whose 16K registers then hold 128 per thread at most.)
//
// Math: warps w and w + 4 own rows w * 16 .. (two heads x 8 tokens) and take
// keys 0-7 and 8-15 of every page with mma.sync m16n8k16. One 8x8 ldmatrix
// matrix takes key t of each of the group's 8 pages (their slots sit in 8
// different bank groups), so an mma's n (for S) or k (for P V) index is the
// page within the group.
#pragma once

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/swizzle.cuh"
#include "config.cuh"
#include "group_step.cuh"
#include "mainloop.cuh"
#include "page_ids.cuh"
#include "params.h"
#include "rows.cuh"
#include "schedule.cuh"
#include "softmax.cuh"

namespace muse_decode::attn2_impl {

template <int kCluster, bool kOneSlice>
struct MainloopMma {
  // One ring for the CTA: warp 0 the producer, all 8 warps the consumers.
  using Ring = pipeline::Ring<kStages, kStageBytes, pipeline::Wait::kSpin>;
  using Position = pipeline::Position<kStages>;

  const Params& p;
  const int32_t* bt;   // the request's block table
  Ring ring;
  __nv_bfloat16* s_q;  // the Q tile after the stages: row = head * 8 + token, kQStride bf16 per row
  int window, lane, warp, rw, kh;
  int slice_id = 0, kvh = 0;  // this cluster's slice and KV head
  KeyRange k{};
  GroupSchedule g{};
  PageIds<kGroupPages> ids;  // (warp 0) the pages of this CTA's groups, a batch of 4 ahead
  uint64_t policy = 0;
  const char* kv = nullptr;  // this KV head's slot of page 0
  int64_t page_pitch = 0;    // bytes between pages
  bool bad = false;    // a page id outside the cache

  // (The setup's kv_map is the TMA loop's: this one copies whole slots of
  // p.kv_cache with cp.async.bulk.)
  __device__ __forceinline__ explicit MainloopMma(const MainloopSetup& su)
      : p(su.p),
        bt(su.p.block_table + static_cast<int64_t>(su.req) * su.p.block_table_stride),
        ring{ptx::smem_addr(su.smem), su.full, su.empty},
        s_q(reinterpret_cast<__nv_bfloat16*>(su.smem + kStagesBytes)),
        window(su.window),
        lane(threadIdx.x % 32),
        warp(threadIdx.x / 32),
        rw(threadIdx.x / 32 % kRowWarps),
        kh(threadIdx.x / 32 / kRowWarps) {}

  // (Thread 0) a stage full after 1 arrival and its bytes, empty after the 8 warps' arrivals.
  __device__ __forceinline__ static void init_barriers(const MainloopSetup& su) {
    const Ring r{ptx::smem_addr(su.smem), su.full, su.empty};
    r.init(kWarps);
  }

  __device__ __forceinline__ bool bad_page() const { return bad; }
  __device__ __forceinline__ bool broken() const { return k.broken; }
  __device__ __forceinline__ bool early_push() const { return false; }
  __device__ __forceinline__ int active() const { return g.active; }
  __device__ __forceinline__ int slice() const { return slice_id; }
  __device__ __forceinline__ int kv_head() const { return kvh; }

  // Everything before the key loop: this thread's Q and gate, L, the
  // schedule and the first ring's copies, all after griddepcontrol.wait (the
  // one-slice kernels let the next launch start first). Returns false where
  // the cluster has no keys (its slice is not in use).
  template <typename Trace>
  __device__ __forceinline__ bool start(RowInputs<kCluster>& in, const RowOwner<kCluster>& rows, const Deployment& d,
                                        int split, int head_y, int rank, int req, Trace& trace) {
    slice_id = split;
    kvh = head_y;
    in.locate(p, rows, req, kvh, rw, kh, lane);
    if (kOneSlice) ptx::griddep_launch_dependents();
    ptx::griddep_wait();
    trace.mark(Phase::kWaited);
    in.load(rows.merger);
    // Without a window the first pages do not depend on L: their ids load
    // with it (one global latency saved).
    if (warp == 0 && window == 0 && lane < kGroupPages) {
      const int pi = (split * kCluster + rank) * kGroupPages + lane;
      if (pi < (p.max_model_len + kPageSize - 1) / kPageSize) ids.first = bt[pi];  // in the table, maybe past L
    }
    const int len = p.seq_lens[req];
    trace.mark_after(Phase::kLength, len);
    k = key_range(len, window, p.max_model_len);
    g = group_schedule<kCluster, kOneSlice>(d, k, split, kvh, rank, req);
    if (g.leaves) return false;
    load(kvh);
    trace.mark(Phase::kAllIssued);
    return true;
  }

  __device__ __forceinline__ void publish_q() const {}

  // The page ids of this CTA's groups b .. b + 3 (page_ids.cuh): lane -> group b + lane / 8, slot lane % 8.
  __device__ __forceinline__ int load_batch(int b) const {
    const int it2 = b + lane / 8;
    const int pi = k.first_page + g.group(it2) * kGroupPages + lane % 8;
    return (it2 < g.my_groups && pi <= k.last_page) ? bt[pi] : -1;
  }
  // Group j (this CTA's j-th) as fill j of the ring, whose stage is free.
  __device__ __forceinline__ void issue(int j) {
    const Position at = Position::of(j);
    const int id = ids.of(j, lane, [&](int b) { return load_batch(b); });
    const bool want = lane < kGroupPages && k.first_page + g.group(j) * kGroupPages + lane <= k.last_page;
    copy_group(ring, at, id, want, p.num_pages, kv, page_pitch, policy, lane, bad);
  }

  // The first ring (the kernel has waited for its predecessor already).
  __device__ __forceinline__ void load(int kvh) {
    policy = ptx::evict_first_policy();
    kv = static_cast<const char*>(p.kv_cache) + static_cast<int64_t>(kvh) * kPageBytes;
    page_pitch = static_cast<int64_t>(p.num_kv_heads) * kPageBytes;
    if (warp != 0) return;
    if (window != 0 && lane < kGroupPages && g.my_groups > 0 && k.first_page + g.me * kGroupPages + lane <= k.last_page)
      ids.first = bt[k.first_page + g.me * kGroupPages + lane];
    ids.next = load_batch(1);
    for (int j = 0; j < min(kStages, g.my_groups); ++j) issue(j);
  }

  // The 16 Q rows of this warp's row block into the Q tile; each of the row
  // block's two warps stores half of them.
  __device__ __forceinline__ void stage_q(const uint4 (&qv)[2]) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const QChunk q = q_chunk(j, kh, lane);
      *reinterpret_cast<uint4*>(&s_q[(rw * 16 + q.r) * kQStride + q.c * 8]) = qv[j];
    }
  }

  template <typename Trace>
  __device__ __forceinline__ void run(SoftmaxState& st, Trace&) {
    // This lane's ldmatrix row of the m16k16 Q fragments: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15).
    const uint32_t q_addr =
        ptx::smem_addr(s_q) + (rw * 16 + swizzle::a_row(lane)) * (kQStride * 2) + swizzle::a_chunk(lane) * 16;
    const int len = k.len;
    const int pos = len - kVerifyLen + lane / 4;  // this thread's rows' position
    const int slot_lo = (lane % 4) * 2;         // page slots of this thread's S columns: slot_lo, slot_lo + 1
    for (int it = 0; it < g.my_groups; ++it) {
      const Position at = Position::of(it);
      ring.wait(at);
      // ldmatrix row address of this lane: page slot lane % 8 of the stage.
      const uint32_t slot = ring.stage_addr(at) + (lane % 8) * kSlotBytes;
      const int key0 = (k.first_page + g.group(it) * kGroupPages) * kPageSize;
      // Uniform per group: only groups holding keys past row 0's position or
      // below row 7's window need masks (and, past L, zeroed V).
      const bool masked = key0 + kGroupKeys - 1 > len - kVerifyLen || (window > 0 && key0 < len - window);

      group_step(st, q_addr, slot, key0, masked, len, pos, slot_lo, window, kh, lane);
      __syncwarp();
      if (lane == 0) ring.release(at);
      if (warp == 0 && it + kStages < g.my_groups) {
        ring.acquire(Position::of(it + kStages));  // every warp is done with this stage
        issue(it + kStages);
      }
    }
    st.reduce_row_sums();
  }
};

}  // namespace muse_decode::attn2_impl
