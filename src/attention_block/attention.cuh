// The block's attention and merge: attn2's parts over fixed key slices.
//
// Share s < pairs x S (pairs = requests x KV heads, S = p.num_splits) takes
// slice s % S of pair s / S: a run of the pair's 8-page groups (the groups
// of L's visible pages, dealt to the S slices in order), through attn2's
// mma.sync group step (group_step.cuh) on its 8 warps: two key halves of 4
// row warps, merged as attn2 merges them. Groups holding only keys older
// than the step copy before the pair's q, k and v are ready; the others
// after. The slice's partial (m, l, unnormalised O per row) goes to the
// workspace.
//
// The merge: once all S partials of the pair are published, share s merges
// rows [s 64 / S, (s + 1) 64 / S) over the S slices in slice order (split
// over up to 8 warps per row, their states joined in warp order), then
// attn2's o-norm and gate give o_proj's x. The order of every sum depends on
// S and the rows alone, never on the grid or on timing.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "../attn2/config.cuh"
#include "../attn2/epilogue.cuh"
#include "../attn2/group_step.cuh"
#include "../attn2/merge.cuh"
#include "../attn2/page_ids.cuh"
#include "../attn2/schedule.cuh"
#include "../attn2/softmax.cuh"
#include "../common/online_softmax.cuh"
#include "../common/pipeline.cuh"
#include "../common/ptx.cuh"
#include "../common/swizzle.cuh"
#include "../common/trace.cuh"
#include "config.cuh"
#include "front.cuh"
#include "muse_decode/o_proj.h"
#include "params.h"

namespace muse_decode::attention_block_impl {

using KeyRing = pipeline::Ring<kKeyStages, attn2_impl::kStageBytes, pipeline::Wait::kSpin>;
inline constexpr int kPartialFloats = 2 + kHeadDim;  // per row: m, l, O
inline constexpr int kMergeBatch = 8;                 // slices whose partial rows a merging warp loads at once

// Waits (every thread) until counter `word` reaches `target`: thread 0 polls
// with acquire loads, the CTA's barrier passes what it saw to the others.
inline __device__ void wait_count(const uint32_t* counters, int word, uint32_t target) {
  if (threadIdx.x == 0) ptx::wait_at_least(counters + word, target);
  __syncthreads();
}

// Which slice of which (request, KV head) share s takes.
struct SliceOf {
  bool valid;
  int pair, slice, req, kvh;
  __device__ static SliceOf of(const Params& p, int share) {
    SliceOf s;
    const int pairs = p.num_reqs * p.num_kv_heads;
    s.valid = share < pairs * p.num_splits;
    s.pair = share / p.num_splits;
    s.slice = share % p.num_splits;
    s.req = s.pair / p.num_kv_heads;
    s.kvh = s.pair % p.num_kv_heads;
    return s;
  }
};

// A slice's keys: its groups [g0, g1) of the pair's visible pages.
struct SliceKeys {
  attn2_impl::KeyRange k;
  int g0 = 0, groups = 0;
  __device__ static SliceKeys of(const Params& p, const SliceOf& s) {
    SliceKeys r;
    r.k = attn2_impl::key_range(p.seq_lens[s.req], p.window, p.max_model_len);
    const int pages = r.k.broken ? 0 : r.k.last_page - r.k.first_page + 1;
    const int total = (pages + attn2_impl::kGroupPages - 1) / attn2_impl::kGroupPages;
    r.g0 = s.slice * total / p.num_splits;
    r.groups = (s.slice + 1) * total / p.num_splits - r.g0;
    return r;
  }
  __device__ int first_page_of(int j) const { return k.first_page + (g0 + j) * attn2_impl::kGroupPages; }
  // The group holds only keys older than the step's (no page the front writes).
  __device__ bool old(int j) const {
    const int last = first_page_of(j) + attn2_impl::kGroupPages - 1;
    return (last < k.last_page ? last : k.last_page) < k.first_new_page;
  }
};

// Warp 0: the slice's group copies (8 pages of one KV head each, into page
// slots kSlotBytes apart), page ids a batch ahead (attn2's PageIds).
struct SliceCopies {
  const Params& p;
  const SliceKeys& sk;
  const KeyRing& ring;
  const int32_t* bt;
  const char* kv;
  int64_t page_pitch;
  uint64_t policy;
  int lane;
  int base;  // the ring's fills before this slice's (earlier shares of the CTA)
  bool bad = false;
  attn2_impl::PageIds<attn2_impl::kGroupPages> ids;

  __device__ SliceCopies(const Params& p_, const SliceKeys& sk_, const KeyRing& ring_, const SliceOf& s, int lane_,
                         int base_)
      : p(p_), sk(sk_), ring(ring_), lane(lane_), base(base_) {
    bt = p.block_table + int64_t{s.req} * p.block_table_stride;
    kv = static_cast<const char*>(p.kv_cache) + int64_t{s.kvh} * attn2_impl::kPageBytes;
    page_pitch = int64_t{p.num_kv_heads} * attn2_impl::kPageBytes;
  }
  // (Warp 0, before the first issue) the first fill's page ids and the first batch.
  __device__ void start() {
    policy = ptx::evict_first_policy();
    if (lane < attn2_impl::kGroupPages && sk.groups > 0 && sk.first_page_of(0) + lane <= sk.k.last_page)
      ids.first = bt[sk.first_page_of(0) + lane];
    ids.next = load_batch(1);
  }
  __device__ int load_batch(int b) const {
    const int j = b + lane / attn2_impl::kGroupPages;
    const int pi = sk.first_page_of(j) + lane % attn2_impl::kGroupPages;
    return (j < sk.groups && pi <= sk.k.last_page) ? bt[pi] : -1;
  }
  // Group j as fill j of the ring, whose stage is free.
  __device__ void issue(int j) {
    const pipeline::Position<kKeyStages> at = pipeline::Position<kKeyStages>::of(base + j);
    const int id = ids.of(j, lane, [&](int b) { return load_batch(b); });
    const bool want = lane < attn2_impl::kGroupPages && sk.first_page_of(j) + lane <= sk.k.last_page;
    attn2_impl::copy_group(ring, at, id, want, p.num_pages, kv, page_pitch, policy, lane, bad);
  }
};

// The slice's partial in the workspace: [64 rows][m, l, O[64]].
inline __device__ float* slice_partial(const Params& p, int pair, int slice) {
  return reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + p.ws.attn_part) +
         (int64_t{pair} * p.num_splits + slice) * attn2_impl::kRows * kPartialFloats;
}

// One share's slice: keys to the partial. smem: the block's shared memory,
// the CTA's front done; fills: the key ring's fills so far (this slice's added).
// Before the wait for the heads, warp 0 copies the first groups of older keys
// into the stages, then calls early(), which copies what else needs no heads
// (o_proj's weight): the keys are needed first.
template <typename Early>
__device__ void attend_slice(const Params& p, const SliceOf& s, uint8_t* smem, const KeyRing& ring, int* s_bad,
                             uint32_t* counters, int& fills, int warp, int lane, trace::Recorder<Phase>& trace,
                             Early&& early) {
  using namespace attn2_impl;
  const SliceKeys sk = SliceKeys::of(p, s);
  const int prefetch = sk.groups < kKeyStages ? sk.groups : kKeyStages;
  SliceCopies copies(p, sk, ring, s, lane, fills);
  int issued = 0;
  if (warp == 0) {
    ptx::fence_proxy_async_smem();  // the stages held the front's generic writes
    copies.start();
    // Groups of older keys only: before the front's heads are ready.
    while (issued < prefetch && sk.old(issued)) copies.issue(issued++);
    early();
  }
  if (threadIdx.x == 0) *s_bad = 0;

  // The pair's q, k and v heads written (and the cache rows of k and v).
  const int group = s.req * kVerifyLen / kTokenGroup;
  wait_count(counters, Counters::kHeadReady + group * p.num_kv_heads + s.kvh, kHeadsPerKvHead + 2);
  if (fills == 0) trace.mark(Phase::kHeadsReady);
  if (warp == 0) {
    ptx::fence_proxy_async_global();  // the new keys, written by other CTAs, read by bulk copies
    while (issued < prefetch) copies.issue(issued++);
  }

  // Q: row r = head (r / 8) x token (r % 8) of this KV head, from the projection.
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kQTileOffset);
  const int n = qkv_width(p.num_kv_heads);
  const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(static_cast<uint8_t*>(p.workspace) + p.ws.qkv);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int idx = threadIdx.x + j * kThreads, r = idx / 8, c = idx % 8;
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(
        qkv + int64_t{s.req * kVerifyLen + r % 8} * n + (s.kvh * kHeadsPerKvHead + r / 8) * kHeadDim + c * 8));
    *reinterpret_cast<uint4*>(&s_q[r * kQStride + c * 8]) = v;
  }
  __syncthreads();
  if (fills == 0) trace.mark(Phase::kQStaged);

  // The key loop (attn2's mma.sync loop with its group step).
  const int rw = warp % kRowWarps, kh = warp / kRowWarps;
  SoftmaxState st;
  st.init();
  const uint32_t q_addr =
      ptx::smem_addr(s_q) + (rw * 16 + swizzle::a_row(lane)) * (kQStride * 2) + swizzle::a_chunk(lane) * 16;
  const int len = sk.k.len;
  const int pos = len - kVerifyLen + lane / 4;
  const int slot_lo = (lane % 4) * 2;
  for (int it = 0; it < sk.groups; ++it) {
    const pipeline::Position<kKeyStages> at = pipeline::Position<kKeyStages>::of(fills + it);
    ring.wait(at);
    const uint32_t slot = ring.stage_addr(at) + (lane % 8) * kSlotBytes;
    const int key0 = sk.first_page_of(it) * kPageSize;
    const bool masked = key0 + kGroupKeys - 1 > len - kVerifyLen || (p.window > 0 && key0 < len - p.window);
    group_step(st, q_addr, slot, key0, masked, len, pos, slot_lo, p.window, kh, lane);
    __syncwarp();
    if (lane == 0) ring.release(at);
    if (warp == 0 && it + kKeyStages < sk.groups) {
      ring.acquire(pipeline::Position<kKeyStages>::of(fills + it + kKeyStages));
      copies.issue(it + kKeyStages);
    }
  }
  if (fills == 0) trace.mark(Phase::kKeysDone);
  fills += sk.groups;
  st.reduce_row_sums();
  if (warp == 0 && __any_sync(0xFFFFFFFFu, copies.bad) && lane == 0) *s_bad = 1;

  // The key halves' merge (attn2's), in the drained stages.
  __syncthreads();
  float4* xchg = reinterpret_cast<float4*>(smem + kKeyRingOffset);
  if (kh == 1) stash_second_half(st, xchg);
  __syncthreads();
  if (kh == 0) {
    merge_second_half(st, xchg);
    if (sk.k.broken || *s_bad != 0) st.l[0] = st.l[1] = NAN;  // a contract break: the rows come out NaN
    float* part = slice_partial(p, s.pair, s.slice);
    // The accumulator layout: rows lane / 4 and + 8 of the warp's 16, columns
    // 2 (lane % 4) and + 1 of each n-tile of 8.
    const int r0 = rw * 16 + lane / 4, c0 = (lane % 4) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = part + (r0 + 8 * h) * kPartialFloats;
      if (lane % 4 == 0) __stcg(reinterpret_cast<float2*>(row), make_float2(st.m[h], st.l[h]));
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        __stcg(reinterpret_cast<float2*>(row + 2 + nt * 8 + c0),
               make_float2(st.o[nt][2 * h], st.o[nt][2 * h + 1]));
    }
  }
  __syncthreads();  // every thread's stores before thread 0's release
  if (threadIdx.x == 0) ptx::red_release_gpu_add(counters + Counters::kSlicesDone + s.pair, 1u);
  trace.mark(Phase::kSliceDone);
}

// One share's rows of its pair, merged over the pair's slices, normed, gated
// and written as o_proj's x; then counted for the token group.
__device__ void merge_rows(const Params& p, const SliceOf& s, float4* s_states, uint32_t* counters, int warp,
                           int lane, trace::Recorder<Phase>& trace) {
  using namespace attn2_impl;
  const int S = p.num_splits;
  const int r_begin = s.slice * kRows / S, r_end = (s.slice + 1) * kRows / S, rows = r_end - r_begin;
  if (rows == 0) return;
  const int group = s.req * kVerifyLen / kTokenGroup;
  // The gate heads (long written by now), then the slices.
  wait_count(counters, Counters::kGateReady + group * p.num_kv_heads + s.kvh, kHeadsPerKvHead);

  // Warps per row: all 8 for one row, fewer as rows grow; warp w takes
  // slices w % wpr, + wpr, ... of row slot w / wpr.
  const int wpr = rows >= 8 ? 1 : rows >= 4 ? 2 : rows >= 2 ? 4 : 8;
  const int slots = kWarps / wpr, sub = warp % wpr;
  const int n = qkv_width(p.num_kv_heads), k_width = o_proj_in_width(p.num_kv_heads);
  const uint8_t* ws = static_cast<const uint8_t*>(p.workspace);
  const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(ws + p.ws.qkv);
  __nv_bfloat16* x = reinterpret_cast<__nv_bfloat16*>(static_cast<uint8_t*>(p.workspace) + p.ws.attn_out);
  const int gate_col = (kHeadsPerKvHead + 2) * p.num_kv_heads * kHeadDim;
  // This warp's first row's gate columns, loaded before the slices' wait.
  const auto gate_of = [&](int r) {
    const int t = s.req * kVerifyLen + r % kVerifyLen, head = s.kvh * kHeadsPerKvHead + r / kVerifyLen;
    return __ldcg(reinterpret_cast<const unsigned int*>(qkv + int64_t{t} * n + gate_col + head * kHeadDim + 2 * lane));
  };
  uint32_t gate_next = (r_begin + warp / wpr < r_end) ? gate_of(r_begin + warp / wpr) : 0u;
  wait_count(counters, Counters::kSlicesDone + s.pair, static_cast<uint32_t>(S));
  trace.mark(Phase::kSlicesReady);
  for (int r0 = r_begin; r0 < r_end; r0 += slots) {
    const int r = r0 + warp / wpr;
    const uint32_t g = gate_next;
    if (r + slots < r_end) gate_next = gate_of(r + slots);
    softmax::State<2> acc;
    if (r < r_end) {
      // In batches of kMergeBatch slices: every load of a batch in flight
      // before its merges (the merges' chain alone is serial).
      for (int j0 = sub; j0 < S; j0 += kMergeBatch * wpr) {
        float2 ml[kMergeBatch], o[kMergeBatch];
#pragma unroll
        for (int b = 0; b < kMergeBatch; ++b) {
          const int j = j0 + b * wpr;
          if (j < S) {
            const float* row = slice_partial(p, s.pair, j) + r * kPartialFloats;
            ml[b] = __ldcg(reinterpret_cast<const float2*>(row));
            o[b] = __ldcg(reinterpret_cast<const float2*>(row + 2 + 2 * lane));
          }
        }
#pragma unroll
        for (int b = 0; b < kMergeBatch; ++b) {
          if (j0 + b * wpr < S) {
            softmax::State<2> part;
            part.m = ml[b].x;
            part.l = ml[b].y;
            part.o[0] = o[b].x;
            part.o[1] = o[b].y;
            acc.merge(part, kScaleLog2);
          }
        }
      }
    }
    if (wpr > 1) {
      s_states[threadIdx.x] = make_float4(acc.m, acc.l, acc.o[0], acc.o[1]);
      __syncthreads();
      if (sub == 0 && r < r_end) {
        for (int w = 1; w < wpr; ++w) {
          const float4 v = s_states[(warp + w) * 32 + lane];
          softmax::State<2> b;
          b.m = v.x;
          b.l = v.y;
          b.o[0] = v.z;
          b.o[1] = v.w;
          acc.merge(b, kScaleLog2);
        }
      }
      __syncthreads();
    }
    if (sub == 0 && r < r_end) {
      const int t = s.req * kVerifyLen + r % kVerifyLen;
      const int head = s.kvh * kHeadsPerKvHead + r / kVerifyLen;
      const float2 gv = ptx::unpack_bf16(g);
      const float sg[2] = {1.0f / (1.0f + __expf(-gv.x)), 1.0f / (1.0f + __expf(-gv.y))};
      finish_row<32, 2>(acc.o, acc.l, sg, x + int64_t{t} * k_width + head * kHeadDim + 2 * lane);
    }
  }
  __syncthreads();  // every thread's stores before thread 0's release
  if (threadIdx.x == 0) ptx::red_release_gpu_add(counters + Counters::kRowsDone + group, static_cast<uint32_t>(rows));
}

}  // namespace muse_decode::attention_block_impl
