// attn2's key loop on sm_90a: each half of the CTA is a warpgroup that
// consumes its own 64-key tiles (schedule.cuh) through kWgStages stages.
//
// Loads: warp 0 of the warpgroup, lanes 0-3, copies one page each (its K and
// V boxes, 2 KB each) by TMA through a 5-D tensor map of the cache (elements,
// K|V, key, KV head, page), 128-byte swizzled, evict-first in the L2. Under
// PDL the pages of the warpgroup's first tile that hold only keys older than
// the step's 8 are copied before griddepcontrol.wait (no kernel of a step
// writes them), the others after it.
//
// Math: S = Q K^T as 4 wgmma m64n64k16 (Q and K from shared memory), O += P V
// as 4 more with P from registers and V from shared memory, so every K/V byte
// is read from shared memory once per warpgroup and the tensor cores run
// beside the other warpgroup's softmax. The next tile's S overlaps the
// current P V (FA3's intra-warpgroup pipeline).
#pragma once

#include <cuda.h>

#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/swizzle.cuh"
#include "../common/trace.cuh"
#include "config.cuh"
#include "mainloop.cuh"
#include "page_ids.cuh"
#include "params.h"
#include "rows.cuh"
#include "schedule.cuh"
#include "softmax.cuh"

namespace muse_decode::attn2_impl {

// The raw scores of one 64-key tile again, on this warp's tensor cores:
// mma.sync m16n8k16, whose accumulators hold the same elements as wgmma's
// m64n64 does for the warp's 16 rows. Q rows rw * 16 .. of q_tile, the keys
// of k_tile, both in the 128-byte swizzle (swizzle.cuh; every row this lane
// addresses has r % 8 = lane % 8). later_softmax's slow path only: one
// k-step at a time, few registers.
__device__ __forceinline__ void scores_again(float (&s)[8][4], uint32_t q_tile, uint32_t k_tile, int rw, int lane) {
  const int sw = lane % 8;
#pragma unroll
  for (int t = 0; t < 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
  // A: the row block's 16 Q rows; B: keys 8t + lane % 8 (one swizzle atom
  // per n-tile t), chunks 2ks and 2ks + 1 from lanes 0-7 and 8-15.
  const uint32_t q_row = q_tile + (rw * 16 + swizzle::a_row(lane)) * swizzle::kRowBytes;
  const uint32_t k_row = k_tile + sw * swizzle::kRowBytes;
#pragma unroll 1
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t a[4];
    ptx::ldmatrix_x4(a, q_row + (((2 * ks + swizzle::a_chunk(lane)) ^ sw) << 4));
    const uint32_t kb = k_row + (((2 * ks + swizzle::b_chunk(lane)) ^ sw) << 4);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      uint32_t b[2];
      ptx::ldmatrix_x2(b, kb + t * swizzle::kAtomBytes);
      ptx::mma_m16n8k16_bf16(s[t], a, b[0], b[1]);
    }
  }
}

template <int kCluster, bool kOneSlice, bool kWindow>
struct MainloopSm90 {
  // later_softmax where a warpgroup can hold more than one tile (not in the
  // one-slice kernels, whose extra keys go to a piece pass instead).
  static constexpr bool kLaterMax = !kOneSlice;
  // Tile 0's slots may lie below the window's first page (the odd tile).
  static constexpr bool kHeadTiles = kOneSlice && kWindow;
  // Each warpgroup's own ring: its kWgStages stages (K then V of a tile)
  // and their barriers, its warp 0 the producer, its 4 warps the consumers.
  using Ring = pipeline::Ring<kWgStages, kWgStageBytes, pipeline::Wait::kSpin>;
  using Position = pipeline::Position<kWgStages>;

  const CUtensorMap* map;
  const Params& p;
  const int32_t* bt;   // the request's block table
  uint32_t q_tile;     // the Q tile after both warpgroups' stages
  int window, lane, rw, kh;
  Ring ring;           // this warpgroup's: stages kh kWgStages .., warpgroup 1's after warpgroup 0's
  uint64_t* tail;      // this warpgroup's: its 4 warps zeroed the V rows past L of a tile
  uint32_t tail_phase = 0;
  KeyRange k{};
  TileSchedule s{};
  PageIds<kTilePages> ids;  // (warp 0 of the warpgroup) the pages of its tiles, a batch of 8 ahead
  int issued = 0;      // tiles issued; -1: tile 0's older pages only
  int first_fills = 0; // the ring's first round: min(kWgStages, my_tiles) tiles
  uint64_t policy = 0;
  bool bad = false;    // a page id outside the cache

  // Both warpgroups' stages: the dynamic shared memory aligned to the swizzle's atom.
  __device__ __forceinline__ static uint32_t aligned_base(const uint8_t* smem) {
    constexpr uint32_t kAlign = swizzle::kAtomBytes;
    return (ptx::smem_addr(smem) + kAlign - 1) & ~(kAlign - 1);
  }
  __device__ __forceinline__ static Ring ring_of(const MainloopSetup& su, uint32_t base, int half) {
    return {base + static_cast<uint32_t>(half * kWgStages * kWgStageBytes), su.full + half * kWgStages,
            su.empty + half * kWgStages};
  }

  __device__ __forceinline__ explicit MainloopSm90(const MainloopSetup& su)
      : map(su.kv_map),
        p(su.p),
        bt(su.p.block_table + static_cast<int64_t>(su.req) * su.p.block_table_stride),
        q_tile(aligned_base(su.smem) + 2 * kWgStages * kWgStageBytes),
        window(su.window),
        lane(threadIdx.x % 32),
        rw(threadIdx.x / 32 % kRowWarps),
        kh(threadIdx.x / 32 / kRowWarps),
        ring(ring_of(su, aligned_base(su.smem), kh)),
        tail(su.tail + kh) {}

  // (Thread 0) both warpgroups' rings: a stage full after 1 arrival and its
  // bytes, empty after its warpgroup's 4 warps' arrivals.
  __device__ __forceinline__ static void init_barriers(const MainloopSetup& su) {
    ptx::prefetch_tensor_map(su.kv_map);
    const uint32_t base = aligned_base(su.smem);
    ring_of(su, base, 0).init(kRowWarps);
    ring_of(su, base, 1).init(kRowWarps);
    for (int h = 0; h < kKeyHalves; ++h) ptx::mbar_init(&su.tail[h], kRowWarps);
  }

  __device__ __forceinline__ bool bad_page() const { return bad; }
  __device__ __forceinline__ bool broken() const { return k.broken; }
  __device__ __forceinline__ bool early_push() const { return s.early_push; }
  __device__ __forceinline__ int active() const { return s.active; }
  __device__ __forceinline__ int slice() const { return s.split; }
  __device__ __forceinline__ int kv_head() const { return s.kv_head; }

  // (Lanes 0-3 of warp 0 of the warpgroup, without a window) the pages of
  // warpgroup v's first tile, which do not depend on L (maybe past L).
  __device__ __forceinline__ int first_tile_ids(int v) const {
    int id = -1;
    if (rw == 0 && window == 0 && lane < kTilePages) {
      const int pi = v * kTilePages + lane;
      id = pi < (p.max_model_len + kPageSize - 1) / kPageSize ? bt[pi] : -1;
    }
    return id;
  }

  // Everything before the key loop: L, the schedule, the first ring's copies
  // around griddepcontrol.wait and this thread's Q and gate (after it).
  // Returns false where the cluster has no keys (its slice is not in use).
  //
  // PDL: up to the wait the kernel reads only the lengths, the block table
  // and keys older than this step's 8. No kernel of a step writes those
  // (qkv_front writes q, gate and the step's 8 keys, after its own wait);
  // the kernels before may still run. The one-slice kernels let the next
  // launch start right after their wait: launches then run at most two deep
  // (a call's CTAs enter ~2.2 us before the previous call ends instead of
  // ~20), and max_model_len 2048 takes 3.28 us against 3.29-3.34 with the
  // trigger at the start. The split kernel triggers once L says every loop
  // of the launch is short (early_push), else after its key loop (at the
  // start: TP8 32k +0.2 us, 128k +0.45).
  template <typename Trace>
  __device__ __forceinline__ bool start(RowInputs<kCluster>& in, const RowOwner<kCluster>& rows, const Deployment& d,
                                        int split, int head_y, int rank, int req, Trace& trace) {
    // The first tile's pages load with L, not after it: for this cluster's
    // place in launch order and for its interleaved place (whether the
    // interleave applies depends on L, which slice it is does not; TP8 128k:
    // the first copies 0.5 us sooner).
    ids.first = first_tile_ids(2 * (split * kCluster + rank) + kh);
    const int first_il = !kOneSlice && d.one_request && d.num_splits > 1
                            ? first_tile_ids(2 * (interleaved_split(head_y, split, d) * kCluster + rank) + kh)
                            : -1;
    const int len = p.seq_lens[req];
    trace.mark_after(Phase::kLength, len);
    k = key_range(len, window, p.max_model_len);
    s = tile_schedule<kCluster, kOneSlice, kWindow>(d, k, split, head_y, rank, kh, req);
    if (s.interleaved) ids.first = first_il;
    if (s.leaves()) return false;
    if (s.early_push) {
      ptx::cluster_arrive_relaxed();  // (see the kernel: the receive area may be written)
      if (!kOneSlice) ptx::griddep_launch_dependents();
    }
    trace.mark(Phase::kScheduled);
    in.locate(p, rows, req, s.kv_head, rw, kh, lane);
    load_before_wait(trace);
    ptx::griddep_wait();
    trace.mark(Phase::kWaited);
    in.load(rows.merger);
    if (kOneSlice) ptx::griddep_launch_dependents();
    load_after_wait();
    trace.mark(Phase::kAllIssued);
    return true;
  }

  // The Q tile is read by wgmma, through the async proxy.
  __device__ __forceinline__ void publish_q() const { ptx::fence_proxy_async_smem(); }

  // The page ids of this warpgroup's tiles b .. b + 7: lane -> tile b + lane / 4, page lane % 4.
  __device__ __forceinline__ int load_batch(int b) const {
    const int t = b + lane / kTilePages;
    const int pi = s.first_page_of(t) + lane % kTilePages;
    return (t < s.my_tiles && pi <= k.last_page && (!kHeadTiles || pi >= k.first_page)) ? bt[pi] : -1;
  }
  // The fill at expects the bytes of the pages this warp's lanes copy (ok).
  __device__ __forceinline__ void arm_stage(Position at, bool ok) {
    const uint32_t ok_mask = __ballot_sync(0xFFFFFFFFu, ok);
    if (lane == 0) ring.arm(at, __popc(ok_mask) * kPageBytes);
    __syncwarp();
  }
  // This lane's page (its K and V boxes) into its slot of the fill at.
  __device__ __forceinline__ void copy_page(Position at, int id, int kvh) const {
    const uint32_t dst = ring.stage_addr(at) + lane * (kHalfBytes / kTilePages);
    ptx::tma_load_5d(dst, map, 0, 0, 0, kvh, id, ring.full_bar(at), policy);               // K
    ptx::tma_load_5d(dst + kHalfBytes, map, 0, 1, 0, kvh, id, ring.full_bar(at), policy);  // V
  }
  // Tile j (this warpgroup's j-th) as fill j of its ring, whose stage is free.
  __device__ __forceinline__ void issue(int j) {
    const Position at = Position::of(j);
    const int id = ids.of(j, lane, [&](int b) { return load_batch(b); });
    const int pi = s.first_page_of(j) + lane;
    const bool want = lane < kTilePages && pi <= k.last_page && (!kHeadTiles || pi >= k.first_page);
    const bool ok = want && id >= 0 && id < p.num_pages;
    bad |= want && !ok;
    arm_stage(at, ok);
    if (ok) copy_page(at, id, s.kv_head);
  }

  // Warp 0 of each warpgroup (rw == 0), before griddepcontrol.wait: up to
  // kEarlyTiles tiles of keys older than this step's 8 (two where the
  // warpgroup takes a pair or a piece). A first tile that holds this step's
  // keys has its older pages copied now, the whole tile's bytes expected on
  // its barrier, and only the pages with the step's keys after the wait.
  template <typename Trace>
  __device__ __forceinline__ void load_before_wait(Trace& trace) {
    first_fills = min(kWgStages, s.my_tiles);
    policy = ptx::evict_first_policy();
    if (rw != 0) return;
    // (Without a window ids.first already holds the first tile's ids, loaded
    // before L, unless the warpgroup takes pairs.)
    if ((window != 0 || s.paired_wgs > 0) && lane < kTilePages && s.my_tiles > 0 &&
        s.first_page_of(0) + lane <= k.last_page)
      ids.first = bt[s.first_page_of(0) + lane];
    ids.next = load_batch(1);
    trace.mark_after(Phase::kFirstIds, ids.first);
    const int early = s.paired_wgs > 0 || s.has_piece ? 2 : kEarlyTiles;
    while (issued < min(first_fills, early) && s.first_page_of(issued) + kTilePages - 1 < k.first_new_page) issue(issued++);
    if (issued == 0 && first_fills > 0 && early > 0 && s.first_page_of(0) < k.first_new_page) {
      const int pi = s.first_page_of(0) + lane;
      const bool want = lane < kTilePages && pi <= k.last_page;
      const bool ok = want && ids.first >= 0 && ids.first < p.num_pages;
      bad |= want && !ok;
      arm_stage(Position::of(0), ok);
      if (ok && pi < k.first_new_page) copy_page(Position::of(0), ids.first, s.kv_head);
      issued = -1;
    }
    trace.mark(Phase::kEarlyIssued);
  }

  // After griddepcontrol.wait: the rest of the first ring.
  __device__ __forceinline__ void load_after_wait() {
    if (rw != 0) return;
    if (issued < 0) {  // tile 0's pages with this step's keys
      const int pi = s.first_page_of(0) + lane;
      if (lane < kTilePages && pi <= k.last_page && pi >= k.first_new_page && ids.first >= 0 &&
          ids.first < p.num_pages)
        copy_page(Position::of(0), ids.first, s.kv_head);
      issued = 1;
    }
    while (issued < first_fills) issue(issued++);
  }

  // The 16 Q rows of this warp's row block into the Q tile, 128-byte swizzled
  // (swizzle.cuh); each of the row block's two warps stores half of them.
  __device__ __forceinline__ void stage_q(const uint4 (&qv)[2]) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const QChunk q = q_chunk(j, kh, lane);
      const int r = rw * 16 + q.r;
      ptx::st_shared_v4(q_tile + swizzle::offset(r, q.c), qv[j].x, qv[j].y, qv[j].z, qv[j].w);
    }
  }

  // ---- the consumer: this warpgroup's tiles through the online softmax ----

  // Tile it's stage (its address), once its copies have landed, with the V
  // rows of keys past L zeroed (they may hold anything, NaN included, and
  // pages past the last are not loaded: P is 0 there, but 0 * NaN is not).
  // key0: the tile's first key; masked: some row does not see some key of it.
  template <typename Trace>
  __device__ __forceinline__ uint32_t tile_ready(int it, int& key0, bool& masked, Trace& trace) {
    const Position at = Position::of(it);
    ring.wait(at);
    if (it == 1) trace.mark(Phase::kSecondTile);
    if (it >= 2) trace.mark(Phase::kLastTile);
    key0 = s.first_page_of(it) * kPageSize;
    const int len = k.len;
    const uint32_t stage = ring.stage_addr(at);
    if (key0 + kTileKeys > len) {
      const uint32_t v_tile = stage + kHalfBytes;
      for (int c = max(0, len - key0) * 8 + static_cast<int>(threadIdx.x % kHalfThreads); c < kTileKeys * 8;
           c += kHalfThreads)
        ptx::st_shared_v4(v_tile + c * 16, 0, 0, 0, 0);
      ptx::fence_proxy_async_smem();
      // The 4 warps meet at an mbarrier, not a named barrier, after which
      // racecheck loses the key-half exchange's order (docs/sanitizers.md).
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(tail);
      ptx::mbar_wait_spin(tail, tail_phase);
      tail_phase ^= 1u;
    }
    // Uniform per tile: only tiles holding keys past row 0's position or
    // below row 7's window need masks.
    masked = key0 + kTileKeys - 1 > len - kVerifyLen || (window > 0 && key0 < len - window);
    return stage;
  }

  // S = Q K^T of the keys at k_tile (a stage, or a piece of one): 4 k-steps
  // of 16 dims (32 bytes into the swizzled rows), asynchronous.
  template <int N>
  __device__ __forceinline__ void issue_s(float (&acc)[N][4], uint32_t k_tile) const {
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ptx::wgmma_ss(acc, ptx::sw128_desc(q_tile + ks * 32, 16, swizzle::kAtomBytes),
                    ptx::sw128_desc(k_tile + ks * 32, 16, swizzle::kAtomBytes), ks);
    ptx::wgmma_commit();
  }
  // The descriptor of k-step kk's V rows (keys 16 kk .. 16 kk + 15: two atoms) of a stage.
  __device__ __forceinline__ uint64_t v_desc(uint32_t stage, int kk) const {
    return ptx::sw128_desc(stage + kHalfBytes + kk * 2 * swizzle::kAtomBytes, kHalfBytes, swizzle::kAtomBytes);
  }
  // O += P V of a stage, asynchronous.
  __device__ __forceinline__ void issue_pv(float (&o)[8][4], const uint32_t (&pa)[4][4], uint32_t stage) const {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_rs(o, pa[kk], v_desc(stage, kk));
    ptx::wgmma_commit();
  }
  // This warp is done with tile it's stage; warp 0 refills it with tile
  // it + kWgStages once all 4 are.
  __device__ __forceinline__ void release(int it) {
    __syncwarp();
    if (lane == 0) ring.release(Position::of(it));
    if (rw == 0 && it + kWgStages < s.my_tiles) {
      ring.acquire(Position::of(it + kWgStages));
      issue(it + kWgStages);
    }
  }

  // Every tile of this warpgroup into st (its rows' O, m and l; l summed over
  // the row's lanes at the end).
  template <typename Trace>
  __device__ __forceinline__ void run(SoftmaxState& st, Trace& trace) {
    const int pos = k.len - kVerifyLen + lane / 4;  // this thread's rows' position
    const int col = (lane % 4) * 2;                 // this thread's first column of each n-tile of 8
    auto mask_if = [&](auto& acc, int key0, bool masked) {
      if (masked) mask_tile(acc, [&](int t, int e) { return key0 + t * 8 + col + (e & 1); }, pos, window);
    };
    float s_acc[8][4];  // S of one tile (64 rows x 64 keys), then its P in fp32
    uint32_t pa[4][4];  // P as the A fragments of O += P V
    if (s.my_tiles > 0) {
      int key0;
      bool masked;
      float alpha[2];
      uint32_t cur = tile_ready(0, key0, masked, trace);
      trace.mark(Phase::kFirstTile);
      issue_s(s_acc, cur);
      if (s.has_piece) {  // (warpgroup-uniform) one pass over the tile and its piece: 64 + 8 keys
        int key0b;
        bool unused;
        const uint32_t sb = tile_ready(1, key0b, unused, trace);
        float t_acc[1][4];
        issue_s(t_acc, sb + s.piece_at * swizzle::kAtomBytes);  // keys 8 piece_at .. of its stage: one swizzle atom
        ptx::wgmma_wait<0>();
        ptx::pin(s_acc);
        ptx::pin(t_acc);
        // Masks where they apply: the piece always, the tile if tile_ready says so.
        const int keyp = key0b + s.piece_at * 8;
        mask_if(s_acc, key0, masked);
        mask_tile(t_acc, [&](int, int e) { return keyp + col + (e & 1); }, pos, window);
        float w[9][4];  // the 72 keys' scores, then their P
#pragma unroll
        for (int t = 0; t < 9; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) w[t][e] = t < 8 ? s_acc[t][e] : t_acc[0][e];
        online_softmax(w, st.m, st.l, alpha);  // (the warpgroup's first tile: O is 0, no rescale)
        // The piece's k-step: its page's 16 keys, the other 8 at P = 0.
        uint32_t pb[1][4];
        const uint32_t pr0 = ptx::pack_bf16(w[8][0], w[8][1]), pr1 = ptx::pack_bf16(w[8][2], w[8][3]);
        const bool hi = s.piece_at % 2;
        pb[0][0] = hi ? 0u : pr0;
        pb[0][1] = hi ? 0u : pr1;
        pb[0][2] = hi ? pr0 : 0u;
        pb[0][3] = hi ? pr1 : 0u;
        pack_p(w, pa);
        trace.mark(Phase::kFirstSoftmax);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) ptx::wgmma_rs(st.o, pa[kk], v_desc(cur, kk));
        ptx::wgmma_rs(st.o, pb[0], v_desc(sb, s.piece_at / 2));
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::pin(st.o);
        ptx::pin_a(pa);
        ptx::pin_a(pb);
        release(0);
      } else {
        ptx::wgmma_wait<0>();
        ptx::pin(s_acc);
        trace.mark(Phase::kFirstScores);
        mask_if(s_acc, key0, masked);
        online_softmax(s_acc, st.m, st.l, alpha);
        rescale(st.o, alpha);
        pack_p(s_acc, pa);
        trace.mark(Phase::kFirstSoftmax);
        for (int it = 0; it + 1 < s.my_tiles; ++it) {
          const uint32_t next = tile_ready(it + 1, key0, masked, trace);
          issue_s(s_acc, next);
          issue_pv(st.o, pa, cur);
          ptx::wgmma_wait<1>();  // S of tile it + 1 (committed first); P V of tile it may still run
          ptx::pin(s_acc);
          bool full_step = true;  // this tile takes online_softmax and O its alpha (rare with kLaterMax)
          if (kLaterMax) {
            mask_if(s_acc, key0, masked);
            full_step = later_softmax(s_acc, st.m, st.l);
          } else {
            mask_if(s_acc, key0, masked);
            online_softmax(s_acc, st.m, st.l, alpha);
          }
          ptx::wgmma_wait<0>();
          ptx::pin(st.o);
          ptx::pin_a(pa);  // the P V just done read pa asynchronously: its registers were live until here
          release(it);
          if (kLaterMax && full_step) {  // (warp-uniform, rare) the scores again, with pa's registers free
            scores_again(s_acc, q_tile, next, rw, lane);
            mask_if(s_acc, key0, masked);
            online_softmax(s_acc, st.m, st.l, alpha);
          }
          if (full_step) rescale(st.o, alpha);
          pack_p(s_acc, pa);
          cur = next;
        }
        issue_pv(st.o, pa, cur);
        ptx::wgmma_wait<0>();
        ptx::pin(st.o);
        ptx::pin_a(pa);
        release(s.my_tiles - 1);
      }
      trace.mark(Phase::kLoopDone);
    }
    st.reduce_row_sums();
  }
};

}  // namespace muse_decode::attn2_impl
