// qkv_front kernels: y = x W^T for 1..16 tokens, q/k RMS norm, interleaved
// RoPE and the paged KV-cache insert in one launch (SPEC section 6). One
// source serves sm_90a and sm_100a (TMA, mbarrier, mma.sync, clusters, PDL).
//
// The cost is reading the weight once (TP8: 37.7 MB, 9.0 us at 4.2 TB/s);
// the math is 0.6 GFLOP at T = 16, so everything is arranged around the
// stream of weight bytes. The weight is cut into 8 KB blocks (64 rows = one
// head, x 64 columns, one TMA box); a producer thread keeps a ring of blocks
// in flight per CTA through cp.async.bulk.tensor + mbarrier; 4 consumer warps
// run mma.sync m16n8k16 with W as A (16 rows per warp) and x^T as B (tokens
// padded to 8 or 16 by the TMA's zero fill), and in the cluster kernel give a
// stage back as soon as its fragments are in registers (their MMAs are on the
// critical path: bench/NOTES-qkv_front.md v7). The weight does not depend on the
// previous kernel, so the producer issues part of the ring before
// griddepcontrol.wait (programmatic dependent launch); x, positions, slots and
// every write come after it. The stream-K kernel stays under 113 KB of shared
// memory, so the next kernel's CTA fits beside it and streams its own weight
// early; the cluster kernel takes the whole SM for a ring twice as deep
// (measured faster).
//
// Two kernels, chosen per KV-head count by the table in launch_qkv_front:
// - Cluster kernel (TP8, 2 KV heads: 36 heads): one thread-block cluster of
//   C = 3 CTAs per head (108 CTAs, one wave), each CTA one slice of K. The
//   non-owner CTAs push their fp32 partials into the owner's shared memory
//   with st.async (distributed shared memory, completing on the owner's
//   mbarrier); the owner (rank 0, the first K slice, longer than the others
//   so that the partials arrive while it still streams) sums them in
//   rank (= K) order and runs the epilogue. No workspace round trip, no
//   arrival counter, no second pass: the v2 stream-K kernel lost ~3.6 us to
//   that global-memory merge at TP8 (bench/NOTES-qkv_front.md).
// - Stream-K kernel (TP1 and the rest): one CTA per SM; CTA c reads blocks
//   [c*B/G, (c+1)*B/G) numbered head-major, so the busiest SM reads one block
//   more than the least busy. A head cut between CTAs is summed in CTA (= K)
//   order by the last CTA to arrive (partials in the workspace, an integer
//   arrival counter), which then runs the epilogue. At TP1 (288 heads) the
//   merge is a small part of 72 us.
// Both merge in a fixed order, so the bits do not depend on timing. The 64
// rows of a tile are exactly one head, so the norm and RoPE are local.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "../common/launch.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/tensor_map_cache.h"
#include "muse_decode/qkv_front.h"
#include "qkv_front_tuning.h"

namespace muse_decode {
namespace {

using detail::map_to_rank;
using detail::mbar_arrive;
using detail::mbar_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::mbar_wait_cluster;
using detail::smem_addr;

// Tuning knobs, for timing experiments (bench/NOTES-qkv_front.md); the
// library is built with the defaults. Run-time knobs: qkv_front_tuning.h.
#ifndef MUSE_QKV_FRONT_STAGES
#define MUSE_QKV_FRONT_STAGES 10
#endif
#ifndef MUSE_QKV_FRONT_L2_PROMOTION  // CUtensorMapL2promotion of the weight: 0 none .. 3 256 B
#define MUSE_QKV_FRONT_L2_PROMOTION 0   // none: TP1 74.2 us against 78.4 with 256 B (H200, NOTES)
#endif
// MUSE_QKV_FRONT_DIAG_SKIP_TAIL / MUSE_QKV_FRONT_DIAG_NO_X: timing
// experiments only (wrong results), stream-K kernel: skip the split-K merge
// and the epilogue / skip the x copies (the MMAs read stale shared memory).
// Cluster kernel: MUSE_QKV_FRONT_DIAG_NO_X as well, MUSE_QKV_FRONT_DIAG_NO_MMA
// (the consumers release each stage without reading it) and
// MUSE_QKV_FRONT_DIAG_FORCE_NT2 (two n-tiles for every T).

constexpr int kConsumerWarps = 4;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kProducerWarp = kConsumerWarps;     // lane 0 issues every copy
constexpr int kStagingWarp = kConsumerWarps + 1;  // loads the epilogue's per-token inputs
constexpr int kThreads = kConsumerThreads + 64;
constexpr int kWBytes = kFrontTileRows * kFrontBlockK * 2;  // 8 KB: one TMA box of the weight
constexpr int kYStride = kFrontTileRows + 4;  // floats per token row of the epilogue tile (no bank conflicts)
// Two CTAs per SM (228 KB, 1 KB reserved per CTA): the next launch's CTA sits
// beside this one and streams its weight before this one ends.
constexpr int kSmemPerCtaBudget = 228 * 1024 / 2 - 1024;

static_assert(kFrontTileRows == kConsumerWarps * 16, "each consumer warp owns 16 rows (one m16 tile) of a head");
static_assert(kFrontBlockK * 2 == 128, "a block row is 128 bytes: the 128-byte TMA swizzle span");
static_assert(kWBytes % 1024 == 0, "128-byte swizzled tiles start on 1024 bytes");
static_assert(kHiddenSize % kFrontBlockK == 0, "K splits into whole blocks");
static_assert(kHeadDim == 64 && kFrontTileRows == kHeadDim, "the epilogue maps lane l to the pair (2l, 2l+1)");

// ---- stream-K kernel layout ----
constexpr int kStages = MUSE_QKV_FRONT_STAGES;
constexpr int kXRowsMax = kFrontMaxTokens;                  // x box: 8 or 16 token rows
constexpr int kXBytes = kXRowsMax * kFrontBlockK * 2;       // 2 KB reserved per stage
constexpr int kStageBytes = kWBytes + kXBytes;
constexpr int kYBytes = kFrontMaxTokens * kYStride * 4;
// Per-token epilogue inputs, staged once per CTA: cos | sin of the token's
// position (64 floats) and its slot.
constexpr int kRopeOffset = kStages * kStageBytes + kYBytes;
constexpr int kSlotOffset = kRopeOffset + kFrontMaxTokens * kHeadDim * 4;
constexpr int kBarrierOffset = kSlotOffset + kFrontMaxTokens * 8;
constexpr int kSmemBytes = 1024 /* alignment slack */ + kBarrierOffset + (2 * kStages + 1) * 8 + 16;

static_assert(kStageBytes % 1024 == 0, "128-byte swizzled tiles start on 1024 bytes");
static_assert(kFrontPartialBytes == kConsumerThreads * 2 * 16, "one float4 per thread and n-tile");
static_assert(kSmemBytes <= kSmemPerCtaBudget, "two CTAs per SM: the next launch starts beside this one");

// ---- cluster kernel layout (NT n-tiles of 8 tokens) ----
// Ring of stages (W block + x block) at offset 0, then the merge slots (the
// owner's: one fp32 partial per other CTA of the cluster; the epilogue's
// token-major tile reuses them once summed), the staged cos|sin rows and
// slots, and the barriers. The stage count is what the budget leaves (one CTA
// per SM): NT = 1 24 stages of 9 KB, NT = 2 21 stages of 10 KB.
constexpr int kClusterMaxCtas = 3;  // CTAs per head
// CTAs per SM of the cluster kernel (H200, bench/NOTES-qkv_front.md v5, v7):
// the whole shared memory as the ring (192 KB of weight in flight per SM)
// beats leaving room for the next launch's CTA: 10.0-10.1 us against 10.4-10.7
// at T <= 8; at T = 16 10.75 against 11.4 once the consumers release a stage
// as soon as it is in registers (v7; before that, two CTAs were faster).
#ifndef MUSE_QKV_FRONT_NT2_CTAS_PER_SM
#define MUSE_QKV_FRONT_NT2_CTAS_PER_SM 1
#endif
template <int NT>
constexpr int cluster_ctas_per_sm() { return NT == 1 ? 1 : MUSE_QKV_FRONT_NT2_CTAS_PER_SM; }
// The consumers' k-steps (bench/NOTES-qkv_front.md v7): each stage's
// ldmatrix loads are all issued before its MMAs, and in the cluster kernel the
// MMAs alternate over kClusterChains independent accumulators (summed in a
// fixed order after the loop), so a stage costs one load latency and a short
// MMA chain. The stream-K kernel keeps one chain (two cost TP1 2 us at T = 16).
#ifndef MUSE_QKV_FRONT_MMA_CHAINS
#define MUSE_QKV_FRONT_MMA_CHAINS 2
#endif
constexpr int kClusterChains = MUSE_QKV_FRONT_MMA_CHAINS;
constexpr int kStreamKChains = 1;
static_assert(kClusterChains == 1 || kClusterChains == 2 || kClusterChains == 4, "the 4 k-steps of a block split evenly over the chains");

template <int NT>
struct ClusterLayout {
  static constexpr int kCtasPerSm = cluster_ctas_per_sm<NT>();
  static constexpr int kBudget = 228 * 1024 / kCtasPerSm - 1024;  // 1 KB reserved per CTA
  static constexpr int kTokens = NT * 8;
  static constexpr int kXBytes = kTokens * kFrontBlockK * 2;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kPartialBytes = kConsumerThreads * NT * 16;  // one float4 per thread and n-tile
  static constexpr int kMergeBytes = (kClusterMaxCtas - 1) * kPartialBytes;
  static constexpr int kRopeBytes = kTokens * kHeadDim * 4;
  static constexpr int kSlotBytes = kTokens * 8;
  static constexpr int kFixedBytes = kMergeBytes + kRopeBytes + kSlotBytes + 2 * 8;  // + staged, merged barriers
  static constexpr int kStages = (kBudget - kFixedBytes) / (kStageBytes + 2 * 8);
  static constexpr int kMergeOffset = kStages * kStageBytes;
  static constexpr int kRopeOffset = kMergeOffset + kMergeBytes;
  static constexpr int kSlotOffset = kRopeOffset + kRopeBytes;
  static constexpr int kBarrierOffset = kSlotOffset + kSlotBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kStages + 2) * 8;
  static_assert(kStageBytes % 1024 == 0, "128-byte swizzled tiles start on 1024 bytes");
  static_assert(kTokens * kYStride * 4 <= kMergeBytes, "the epilogue tile fits in the merge slots");
  static_assert(kSmemBytes <= kBudget, "the layout fits kCtasPerSm CTAs per SM");
  static_assert(kStages >= 8, "at least 64 KB of weight in flight per CTA");
};

// ---------------------------------------------------------------------------
// PTX wrappers (the shared-memory barriers and mapa: ../common/sm90_mbarrier.cuh).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// D += A (16x16, row) * B (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The 128 consumer threads only (the producer warp never joins).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

__device__ __forceinline__ void wait_for_producer_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Clusters and distributed shared memory.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
// Split cluster barrier: every thread arrives once at the start; a thread
// waits before its first access to another CTA's shared memory. Threads that
// exit without waiting are not waited for. The arrival is relaxed: what it
// publishes is the barrier inits, which fence.mbarrier_init.release.cluster
// already releases (the PTX ISA's pattern); the release form compiles to a
// MEMBAR.ALL.GPU per thread in front of the first copies (TP8 0.15-0.2 us:
// bench/NOTES-qkv_front.md).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
// 16 bytes into another CTA's shared memory, counted on its mbarrier.
__device__ __forceinline__ void st_async_v4(uint32_t remote, float x, float y, float z, float w, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "f"(x), "f"(y), "f"(z), "f"(w), "r"(remote_bar)
               : "memory");
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows
// written by TMA with the 128-byte swizzle (chunk index XOR row mod 8).
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// CTA owning block `blk` of `blocks` split over `ctas`: the largest c with
// floor(c * blocks / ctas) <= blk.
__device__ __forceinline__ int owner_of(int64_t blk, int64_t blocks, int ctas) {
  return static_cast<int>(((blk + 1) * ctas + blocks - 1) / blocks) - 1;
}

// ---------------------------------------------------------------------------
// Shared pieces of both kernels.

// The epilogue's per-token inputs (cos | sin of each position, clamped into
// the table, and the slots), staged in shared memory by a warp of its own so
// that the kernel's tail reads no global memory for them. A warp of its own:
// the producer must never wait behind these loads (run 2 in NOTES: done by the
// producer warp's idle lanes, they delayed the producer by ~0.6 us per token).
__device__ __forceinline__ void stage_epilogue_inputs(const QkvFrontParams& p, float* s_rope, int64_t* s_slot,
                                                      uint32_t staged_bar, int lane) {
  wait_for_producer_grid();
  const int T = p.num_tokens;
  int64_t pos = 0;
  if (lane < T) {
    pos = p.positions[lane];
    pos = pos < 0 ? 0 : pos >= p.max_pos ? p.max_pos - 1 : pos;
    s_slot[lane] = p.slot_mapping[lane];
  }
  if (p.cos_sin != nullptr) {
    float c[kFrontMaxTokens], sn[kFrontMaxTokens];
#pragma unroll
    for (int t = 0; t < kFrontMaxTokens; ++t) {  // all loads in flight before the first store
      const int64_t row = __shfl_sync(0xFFFFFFFFu, pos, t);
      c[t] = t < T ? p.cos_sin[row * kHeadDim + lane] : 0.0f;
      sn[t] = t < T ? p.cos_sin[row * kHeadDim + kHeadDim / 2 + lane] : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < kFrontMaxTokens; ++t) {
      if (t < T) {
        s_rope[t * kHeadDim + lane] = c[t];
        s_rope[t * kHeadDim + kHeadDim / 2 + lane] = sn[t];
      }
    }
  }
  __syncwarp();
  if (lane == 0) mbar_arrive(staged_bar);
}

// The producer's steady state, shared by both kernels: blocks S .. n - 1 of
// the CTA's ring of S stages, each into the stage its consumers released
// last (stage i % S, once its empty barrier completes phase i / S - 1).
template <int S, typename IssueW, typename IssueX>
__device__ __forceinline__ void refill_ring(const uint64_t* empty, int n, IssueW&& issue_w, IssueX&& issue_x) {
  int s = 0;
  uint32_t phase = 0;  // parity of the empty-barrier phase to wait for
  for (int i = S; i < n; ++i) {
    mbar_wait(smem_addr(&empty[s]), phase);
    issue_w(i, s);
    issue_x(i, s);
    if (++s == S) {
      s = 0;
      phase ^= 1u;
    }
  }
}

// The consumers' accumulators: kMmaChains independent chains of NT n-tiles.
template <int NT, int kMmaChains>
__device__ __forceinline__ void zero_chains(float (&chains)[kMmaChains][NT][4]) {
#pragma unroll
  for (int c = 0; c < kMmaChains; ++c)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) chains[c][nt][0] = chains[c][nt][1] = chains[c][nt][2] = chains[c][nt][3] = 0.0f;
}

// acc = chain 0 + chain 1 + ... (this order, so the bits are fixed).
template <int NT, int kMmaChains>
__device__ __forceinline__ void sum_chains(const float (&chains)[kMmaChains][NT][4], float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = chains[0][nt][e];
#pragma unroll
      for (int c = 1; c < kMmaChains; ++c) v += chains[c][nt][e];
      acc[nt][e] = v;
    }
}

// A block's operands in registers: the warp's A fragments and the B fragments
// of its NT n-tiles for the 4 k-steps.
template <int NT>
struct BlockFrags {
  uint32_t a[kFrontBlockK / 16][4];
  uint32_t b[kFrontBlockK / 16][NT][2];
};

template <int NT>
__device__ __forceinline__ void load_block(BlockFrags<NT>& f, uint32_t w_s, uint32_t x_s, int a_row, int a_chunk,
                                           int b_row, int b_chunk) {
#pragma unroll
  for (int ks = 0; ks < kFrontBlockK / 16; ++ks) {
    ldmatrix_x4(w_s + swizzled(a_row, ks * 2 + a_chunk), f.a[ks][0], f.a[ks][1], f.a[ks][2], f.a[ks][3]);
    if constexpr (NT == 2)
      ldmatrix_x4(x_s + swizzled(b_row, ks * 2 + b_chunk), f.b[ks][0][0], f.b[ks][0][1], f.b[ks][NT - 1][0],
                  f.b[ks][NT - 1][1]);
    else
      ldmatrix_x2(x_s + swizzled(b_row & 7, ks * 2 + b_chunk), f.b[ks][0][0], f.b[ks][0][1]);
  }
}

template <int NT, int kMmaChains>
__device__ __forceinline__ void mma_frags(float (&chains)[kMmaChains][NT][4], const BlockFrags<NT>& f) {
#pragma unroll
  for (int ks = 0; ks < kFrontBlockK / 16; ++ks)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      mma_bf16(chains[ks % kMmaChains][nt], f.a[ks][0], f.a[ks][1], f.a[ks][2], f.a[ks][3], f.b[ks][nt][0],
               f.b[ks][nt][1]);
}

// One block of 64 weight rows x 64 columns against x: the warp's 16 rows
// (A, ldmatrix from the swizzled W tile) times NT n-tiles of 8 tokens (B);
// k-step ks accumulates into chain ks % kMmaChains.
template <int NT, int kMmaChains>
__device__ __forceinline__ void mma_block(float (&chains)[kMmaChains][NT][4], uint32_t w_s, uint32_t x_s, int a_row,
                                          int a_chunk, int b_row, int b_chunk) {
  BlockFrags<NT> f;
  load_block(f, w_s, x_s, a_row, a_chunk, b_row, b_chunk);
  mma_frags(chains, f);
}

// Epilogue of one head (tile) whose sums are in the consumers' fragments:
// fragments -> ybuf[token][row], then per token (one warp each) the RMS norm
// and RoPE of q and k heads, the bf16 row of out, and k/v into the cache.
// Ends with a consumer barrier, so ybuf may be rewritten afterwards.
template <int NT>
__device__ __forceinline__ void head_epilogue(const float (&acc)[NT][4], float* ybuf, const float* s_rope,
                                              const int64_t* s_slot, uint32_t staged_bar, bool& inputs_staged,
                                              int tile, const QkvFrontParams& p, int warp, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = warp * 16 + g, tok = nt * 8 + tq * 2;
    ybuf[tok * kYStride + row] = acc[nt][0];
    ybuf[(tok + 1) * kYStride + row] = acc[nt][1];
    ybuf[tok * kYStride + row + 8] = acc[nt][2];
    ybuf[(tok + 1) * kYStride + row + 8] = acc[nt][3];
  }
  consumer_sync();
  if (!inputs_staged) {
    mbar_wait(staged_bar, 0);
    inputs_staged = true;
  }
  const int kvh = p.num_kv_heads;
  const int q_heads = kHeadsPerKvHead * kvh;
  // 0: q, 1: k, 2: v, 3: gate
  const int kind = tile < q_heads ? 0 : tile < q_heads + kvh ? 1 : tile < q_heads + 2 * kvh ? 2 : 3;
  const int kv_head = kind == 1 ? tile - q_heads : tile - q_heads - kvh;
  for (int t = warp; t < p.num_tokens; t += kConsumerWarps) {
    const float2 y = *reinterpret_cast<const float2*>(&ybuf[t * kYStride + 2 * lane]);
    float y0 = y.x, y1 = y.y;
    if (kind <= 1) {
      // Weightless RMS norm over the head's 64 values (fixed butterfly order).
      float ss = y0 * y0 + y1 * y1;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, m);
      const float r = rsqrtf(ss * (1.0f / kHeadDim) + kRmsNormEps);
      y0 *= r;
      y1 *= r;
      if (p.cos_sin != nullptr) {
        const float c = s_rope[t * kHeadDim + lane], sn = s_rope[t * kHeadDim + kHeadDim / 2 + lane];
        const float r0 = y0 * c - y1 * sn, r1 = y0 * sn + y1 * c;
        y0 = r0;
        y1 = r1;
      }
    }
    const __nv_bfloat162 v = __floats2bfloat162_rn(y0, y1);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + t * p.out_stride + tile * kFrontTileRows;
    reinterpret_cast<__nv_bfloat162*>(out)[lane] = v;
    if (kind == 1 || kind == 2) {
      const int64_t slot = s_slot[t];
      if (slot >= 0 && slot < p.num_slots) {
        const int64_t row = ((slot / kPageSize) * kvh + kv_head) * kPageSize + slot % kPageSize;
        __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.kv_cache) + row * kCacheRowWidth + (kind == 2 ? kHeadDim : 0);
        reinterpret_cast<__nv_bfloat162*>(dst)[lane] = v;
      }
    }
  }
  consumer_sync();  // ybuf is rewritten by the next head
}

// ---------------------------------------------------------------------------
// Stream-K kernel. NT: n-tiles of 8 tokens (1 for T <= 8, 2 for T <= 16).
// pre_stages: ring stages issued before griddepcontrol.wait (1..kStages).
template <int NT>
__global__ void __launch_bounds__(kThreads, 2)
    qkv_front_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                     const QkvFrontParams p, const int pre_stages) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* ybuf = reinterpret_cast<float*>(smem + kStages * kStageBytes);
  float* s_rope = reinterpret_cast<float*>(smem + kRopeOffset);      // [T][64]: cos | sin
  int64_t* s_slot = reinterpret_cast<int64_t*>(smem + kSlotOffset);  // [T]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);
  uint64_t* empty = full + kStages;
  uint64_t* staged = empty + kStages;  // the epilogue inputs are in s_rope / s_slot
  int* s_last = reinterpret_cast<int*>(staged + 1);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = p.num_kv_heads;
  const int tiles = 2 * (kHeadsPerKvHead + 1) * kvh;
  const int64_t blocks = int64_t{tiles} * kFrontBlocksPerTile;
  const int ctas = gridDim.x, cta = blockIdx.x;
  const int64_t b_begin = cta * blocks / ctas, b_end = (cta + 1) * blocks / ctas;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_addr(&full[s]), 1);
      mbar_init(smem_addr(&empty[s]), kConsumerWarps);
    }
    mbar_init(smem_addr(staged), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The next kernel may start as soon as every CTA is here: its reads before
  // its griddepcontrol.wait are of what no kernel of a step writes (its own
  // weights; attn2: lengths, block tables, keys older than the step's), and
  // the wait then waits for all of this grid.
  allow_dependent_grid();

#ifdef MUSE_QKV_FRONT_DIAG_NO_X
  constexpr uint32_t kTxBytes = kWBytes;
#else
  constexpr uint32_t kTxBytes = kWBytes + NT * 8 * kFrontBlockK * 2;
#endif
  if (warp == kStagingWarp) {
    stage_epilogue_inputs(p, s_rope, s_slot, smem_addr(staged), lane);
    return;
  }
  if (warp == kProducerWarp) {
    if (lane != 0) return;
    // ---- lane 0, the producer: streams the CTA's blocks through the ring ----
    prefetch_tensor_map(&w_map);
    prefetch_tensor_map(&x_map);
    const int n = static_cast<int>(b_end - b_begin);
    const int ring = n < kStages ? n : kStages;
    const int pre = pre_stages < ring ? pre_stages : ring;
    const auto issue_w = [&](int i, int s) {
      const int64_t b = b_begin + i;
      mbar_expect_tx(smem_addr(&full[s]), kTxBytes);
      tma_load_2d(smem_addr(smem + s * kStageBytes), &w_map, smem_addr(&full[s]),
                  static_cast<int>(b % kFrontBlocksPerTile) * kFrontBlockK,
                  static_cast<int>(b / kFrontBlocksPerTile) * kFrontTileRows);
    };
    const auto issue_x = [&](int i, int s) {
#ifndef MUSE_QKV_FRONT_DIAG_NO_X
      const int64_t b = b_begin + i;
      tma_load_2d(smem_addr(smem + s * kStageBytes + kWBytes), &x_map, smem_addr(&full[s]),
                  static_cast<int>(b % kFrontBlocksPerTile) * kFrontBlockK, 0);
#endif
    };
    for (int i = 0; i < pre; ++i) issue_w(i, i);
    wait_for_producer_grid();  // x is the previous kernel's output
    for (int i = 0; i < pre; ++i) issue_x(i, i);
    for (int i = pre; i < ring; ++i) {  // empty stages: no consumer to wait for
      issue_w(i, i);
      issue_x(i, i);
    }
    refill_ring<kStages>(empty, n, issue_w, issue_x);
    return;
  }

  // ---- consumers ----------------------------------------------------------
  wait_for_producer_grid();  // positions, slots and every write below
  const int tid = threadIdx.x;
  // ldmatrix row addresses (see swizzled()): A = the warp's 16 weight rows,
  // matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15); B = x rows (tokens),
  // matrices (k 0-7 | 8-15) x (tokens 0-7 | 8-15).
  const int a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;

  uint32_t* counters = static_cast<uint32_t*>(p.workspace);
  const int64_t counter_bytes = (int64_t{tiles} * 4 + 255) / 256 * 256;
  float4* partials = reinterpret_cast<float4*>(static_cast<uint8_t*>(p.workspace) + counter_bytes);
  constexpr int kPartialFloat4 = kFrontPartialBytes / 16;

  int s = 0;
  uint32_t phase = 0;
  bool inputs_staged = false;
  int64_t b = b_begin;
  while (b < b_end) {
    const int tile = static_cast<int>(b / kFrontBlocksPerTile);
    const int64_t tile_begin = int64_t{tile} * kFrontBlocksPerTile, tile_end = tile_begin + kFrontBlocksPerTile;
    const int64_t seg_end = b_end < tile_end ? b_end : tile_end;
    const bool whole = b == tile_begin && seg_end == tile_end;

    float chains[kStreamKChains][NT][4];
    zero_chains(chains);
    for (; b < seg_end; ++b) {
      mbar_wait(smem_addr(&full[s]), phase);
      const uint32_t w_s = smem_addr(smem + s * kStageBytes);
      mma_block(chains, w_s, w_s + kWBytes, a_row, a_chunk, b_row, b_chunk);
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
      if (++s == kStages) {
        s = 0;
        phase ^= 1u;
      }
    }
    float acc[NT][4];
    sum_chains(chains, acc);

#ifdef MUSE_QKV_FRONT_DIAG_SKIP_TAIL
    if (tile >= 0) continue;
#endif
    if (!whole) {
      // Publish this CTA's partial of the tile; the last of the tile's CTAs
      // sums all of them in CTA order.
      float4* mine = partials + int64_t{tile + cta} * kPartialFloat4;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        __stcg(&mine[tid * 2 + nt], make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]));
      // The cooperative-groups grid-sync pattern: the barrier orders the
      // CTA's stores before thread 0's fence and arrival, and the arrival
      // that completes the count orders every partial before the reads.
      consumer_sync();
      const int first = owner_of(tile_begin, blocks, ctas), last = owner_of(tile_end - 1, blocks, ctas);
      if (tid == 0) {
        __threadfence();
        const uint32_t arrived = atomicAdd(&counters[tile], 1u);
        const int is_last = arrived == static_cast<uint32_t>(last - first);
        if (is_last) {
          counters[tile] = 0u;  // ready for the next launch
          __threadfence();
        }
        *s_last = is_last;
      }
      consumer_sync();
      if (!*s_last) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
      for (int c = first; c <= last; ++c) {
        const float4* part = partials + int64_t{tile + c} * kPartialFloat4;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float4 v = __ldcg(&part[tid * 2 + nt]);
          acc[nt][0] += v.x;
          acc[nt][1] += v.y;
          acc[nt][2] += v.z;
          acc[nt][3] += v.w;
        }
      }
    }
    head_epilogue<NT>(acc, ybuf, s_rope, s_slot, smem_addr(staged), inputs_staged, tile, p, warp, lane);
  }
}

// ---------------------------------------------------------------------------
// Cluster kernel: one cluster of `split.ctas` CTAs per head (cluster id =
// head). Rank 0, the owner, streams K blocks [0, owner_blocks); rank r >= 1
// streams the next equal share, the last rank up to the end of K.
struct ClusterSplit {
  int ctas;          // CTAs per head = the cluster size, 1..kClusterMaxCtas
  int owner_blocks;  // K blocks of rank 0
  int pre_stages;    // ring stages issued before griddepcontrol.wait
};

template <int NT>
__global__ void __launch_bounds__(kThreads, cluster_ctas_per_sm<NT>())
    qkv_front_cluster_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                             const QkvFrontParams p, const ClusterSplit split) {
  using L = ClusterLayout<NT>;
  constexpr int S = L::kStages;
  // 1024-byte alignment of the dynamic shared memory (the 128-byte swizzle's
  // period), checked at entry.
  extern __shared__ __align__(1024) uint8_t smem[];
  float* merge = reinterpret_cast<float*>(smem + L::kMergeOffset);  // [ctas - 1][128 threads][NT] float4
  float* ybuf = merge;                                               // reused once the partials are summed
  float* s_rope = reinterpret_cast<float*>(smem + L::kRopeOffset);
  int64_t* s_slot = reinterpret_cast<int64_t*>(smem + L::kSlotOffset);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* empty = full + S;
  uint64_t* staged = empty + S;   // the epilogue inputs are in s_rope / s_slot
  uint64_t* merged = staged + 1;  // owner: every other CTA's partial has landed

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = cluster_ctarank();
  const int head = static_cast<int>(cluster_id_x());
  const int C = split.ctas;
  const int other = C > 1 ? (kFrontBlocksPerTile - split.owner_blocks) / (C - 1) : 0;
  const int k_begin = rank == 0 ? 0 : split.owner_blocks + (static_cast<int>(rank) - 1) * other;
  const int k_end = rank == 0 ? split.owner_blocks : static_cast<int>(rank) == C - 1 ? kFrontBlocksPerTile : k_begin + other;

  if (threadIdx.x == 0) {
    if (smem_addr(smem) & 1023u) __trap();  // the swizzle addressing below needs it
    for (int s = 0; s < S; ++s) {
      mbar_init(smem_addr(&full[s]), 1);
      mbar_init(smem_addr(&empty[s]), kConsumerWarps);
    }
    mbar_init(smem_addr(staged), 1);
    mbar_init(smem_addr(merged), 1);
    // The owner's own arrival, expecting the others' partials (none: C = 1).
    if (rank == 0) mbar_expect_tx(smem_addr(merged), static_cast<uint32_t>((C - 1) * L::kPartialBytes));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  cluster_arrive();
  allow_dependent_grid();  // as in qkv_front_kernel

#ifdef MUSE_QKV_FRONT_DIAG_NO_X
  constexpr uint32_t kTxBytes = kWBytes;
#else
  constexpr uint32_t kTxBytes = L::kStageBytes;
#endif
  if (warp == kStagingWarp) {
    if (rank == 0) stage_epilogue_inputs(p, s_rope, s_slot, smem_addr(staged), lane);
    return;
  }
  if (warp == kProducerWarp) {
    if (lane != 0) return;
    prefetch_tensor_map(&w_map);
    prefetch_tensor_map(&x_map);
    const int n = k_end - k_begin;
    const int ring = n < S ? n : S;
    const int pre = split.pre_stages < ring ? split.pre_stages : ring;
    const auto issue_w = [&](int i, int s) {
      mbar_expect_tx(smem_addr(&full[s]), kTxBytes);
      tma_load_2d(smem_addr(smem + s * L::kStageBytes), &w_map, smem_addr(&full[s]), (k_begin + i) * kFrontBlockK,
                  head * kFrontTileRows);
    };
    const auto issue_x = [&](int i, int s) {
#ifndef MUSE_QKV_FRONT_DIAG_NO_X
      tma_load_2d(smem_addr(smem + s * L::kStageBytes + kWBytes), &x_map, smem_addr(&full[s]),
                  (k_begin + i) * kFrontBlockK, 0);
#endif
    };
    for (int i = 0; i < pre; ++i) issue_w(i, i);
    wait_for_producer_grid();  // x is the previous kernel's output
    // The empty stages first: the weight keeps HBM busy from the moment the
    // previous grid is done, before the consumers have x.
    for (int i = pre; i < ring; ++i) issue_w(i, i);
    for (int i = 0; i < ring; ++i) issue_x(i, i);
    refill_ring<S>(empty, n, issue_w, issue_x);
    return;
  }

  // ---- consumers ----------------------------------------------------------
  wait_for_producer_grid();  // positions, slots and every write below
  const int tid = threadIdx.x;
  const int a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;

  float chains[kClusterChains][NT][4];
  zero_chains(chains);
  int s = 0;
  uint32_t phase = 0;
  for (int i = k_begin; i < k_end; ++i) {
    mbar_wait(smem_addr(&full[s]), phase);
    const uint32_t w_s = smem_addr(smem + s * L::kStageBytes);
    // The stage is free once its fragments are in registers; the MMAs run
    // while the producer refills it.
#ifndef MUSE_QKV_FRONT_DIAG_NO_MMA
    BlockFrags<NT> f;
    load_block(f, w_s, w_s + kWBytes, a_row, a_chunk, b_row, b_chunk);
#else
    (void)w_s;
#endif
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
#ifndef MUSE_QKV_FRONT_DIAG_NO_MMA
    mma_frags(chains, f);
#endif
    if (++s == S) {
      s = 0;
      phase ^= 1u;
    }
  }
  float acc[NT][4];
  sum_chains(chains, acc);

  constexpr int kPartialFloats = L::kPartialBytes / 4;
  if (rank != 0) {
    // Push the partial into slot rank-1 of the owner; its barrier counts the bytes.
    cluster_wait_acquire();  // the owner's barrier is initialised
    const uint32_t slot = smem_addr(merge + (rank - 1) * kPartialFloats + tid * NT * 4);
    const uint32_t remote = map_to_rank(slot, 0), remote_bar = map_to_rank(smem_addr(merged), 0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) st_async_v4(remote + nt * 16, acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3], remote_bar);
    return;
  }
  // Owner: the others' partials, added in rank (= K) order.
  mbar_wait_cluster(smem_addr(merged), 0);
  for (int c = 1; c < C; ++c) {
    const float4* part = reinterpret_cast<const float4*>(merge + (c - 1) * kPartialFloats) + tid * NT;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float4 v = part[nt];
      acc[nt][0] += v.x;
      acc[nt][1] += v.y;
      acc[nt][2] += v.z;
      acc[nt][3] += v.w;
    }
  }
  consumer_sync();  // every partial is read before ybuf overwrites the slots
  bool inputs_staged = false;
  head_epilogue<NT>(acc, ybuf, s_rope, s_slot, smem_addr(staged), inputs_staged, head, p, warp, lane);
}

// ---------------------------------------------------------------------------
// Host side: tensor maps and the launches.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() { return detail::encode_tiled_fn(); }

// A bf16 [rows, 8192] tensor read in boxes of box_rows x 64 columns, 128-byte swizzle.
bool encode_map(CUtensorMap* map, const void* data, int64_t rows, int64_t row_stride, int box_rows) {
  const auto encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kHiddenSize), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {kFrontBlockK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                static_cast<CUtensorMapL2promotion>(MUSE_QKV_FRONT_L2_PROMOTION),
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The two maps of a launch come from this thread's table (tensor_map_cache.h):
// a layer's weight always hits it, x when the allocator hands back its buffer.
bool make_map(CUtensorMap* map, const void* data, int64_t rows, int64_t row_stride, int box_rows) {
  return detail::cached_tensor_map<8>(map, detail::TensorMapKey{data, {rows, row_stride, box_rows}},
                                      [&](CUtensorMap* m) { return encode_map(m, data, rows, row_stride, box_rows); });
}

// The dynamic shared-memory limit is raised once per device and kernel.
template <typename Kernel>
cudaError_t prepare_once(std::atomic<uint64_t>& done, Kernel kernel, int smem_bytes) {
  int dev = 0;
  if (cudaError_t err = cudaGetDevice(&dev)) return err;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

template <int NT>
cudaError_t prepare_kernel() {
  static std::atomic<uint64_t> done{0};
  return prepare_once(done, qkv_front_kernel<NT>, kSmemBytes);
}

template <int NT>
cudaError_t prepare_cluster_kernel() {
  static std::atomic<uint64_t> done{0};
  return prepare_once(done, qkv_front_cluster_kernel<NT>, ClusterLayout<NT>::kSmemBytes);
}

qkv_front_tuning::Tuning g_tuning;  // all zero: the library's choices

template <int NT>
cudaError_t launch(const QkvFrontParams& p, cudaStream_t stream) {
  if (cudaError_t err = prepare_kernel<NT>()) return err;
  CUtensorMap w_map, x_map;
  if (!make_map(&w_map, p.weight, qkv_width(p.num_kv_heads), kHiddenSize, kFrontTileRows) ||
      !make_map(&x_map, p.x, p.num_tokens, p.x_stride, NT * 8))
    return cudaErrorInvalidValue;
  const int pre = g_tuning.streamk_pre_stages > 0 ? g_tuning.streamk_pre_stages : kStages;
  const detail::LaunchShape shape{dim3(p.num_ctas), dim3(kThreads), kSmemBytes, 0, p.pdl};
  return static_cast<cudaError_t>(detail::launch_kernel<qkv_front_kernel<NT>>(shape, stream, w_map, x_map, p, pre));
}

// Cluster kernel defaults (H200 runs in bench/NOTES-qkv_front.md, v3).
constexpr int kDefaultClusterCtas = 3;   // 36 heads x 3 = 108 CTAs at TP8: one wave
// K blocks (of 128) the owner streams (bench --variants, v7 in the notes):
// one n-tile 44 / 42 / 42; two, whose epilogue is longer, 54 / 37 / 37, so
// that under PDL the other two CTAs leave early and the next launch's CTAs
// take their SMs (T = 16: 10.20 us against 10.47 with 50 and 10.79 with 44).
// Not chosen by PDL on or off: the split sets the order of the sums, and the
// bits must not depend on how the kernel was launched.
template <int NT>
constexpr int default_owner_blocks() { return NT == 1 ? 44 : 54; }
// Every stage before the wait: run 4 measured 10.45 / 11.69 us (T = 1 / 9)
// against 10.67 / 12.26 with 4 stages left for after it; with the 24-stage
// one-CTA ring (v5) 9.84 us at T = 1 against 10.59 with 5 stages before it
// and 10.88 with 3.
template <int NT>
constexpr int default_cluster_pre_stages() { return ClusterLayout<NT>::kStages; }

template <int NT>
cudaError_t launch_cluster(const QkvFrontParams& p, cudaStream_t stream) {
  if (cudaError_t err = prepare_cluster_kernel<NT>()) return err;
  CUtensorMap w_map, x_map;
  if (!make_map(&w_map, p.weight, qkv_width(p.num_kv_heads), kHiddenSize, kFrontTileRows) ||
      !make_map(&x_map, p.x, p.num_tokens, p.x_stride, NT * 8))
    return cudaErrorInvalidValue;
  ClusterSplit split;
  split.ctas = g_tuning.cluster_ctas > 0 ? g_tuning.cluster_ctas : kDefaultClusterCtas;
  split.owner_blocks = g_tuning.owner_blocks > 0 ? g_tuning.owner_blocks : default_owner_blocks<NT>();
  split.pre_stages = g_tuning.pre_stages > 0 ? g_tuning.pre_stages : default_cluster_pre_stages<NT>();
  if (split.ctas < 1 || split.ctas > kClusterMaxCtas || split.owner_blocks < 1 ||
      split.owner_blocks > kFrontBlocksPerTile - (split.ctas - 1) ||
      (split.ctas > 1 && (kFrontBlocksPerTile - split.owner_blocks) / (split.ctas - 1) < 1))
    return cudaErrorInvalidValue;
  if (split.ctas == 1) split.owner_blocks = kFrontBlocksPerTile;
  const int heads = qkv_width(p.num_kv_heads) / kFrontTileRows;
  const detail::LaunchShape shape{dim3(heads * split.ctas), dim3(kThreads),
                                  static_cast<unsigned>(ClusterLayout<NT>::kSmemBytes), split.ctas, p.pdl};
  return static_cast<cudaError_t>(
      detail::launch_kernel<qkv_front_cluster_kernel<NT>>(shape, stream, w_map, x_map, p, split));
}

// Which kernel serves a KV-head count: the cluster kernel where one cluster
// per head fills the GPU in one wave (2 KV heads: 36 heads x 3 CTAs = 108),
// stream-K elsewhere (1 KV head: 18 x 3 = 54 CTAs would leave half the SMs
// idle; 4 and more: enough heads that the stream-K merge is a small part).
enum class Path { kStreamK, kCluster };
Path path_for(int num_kv_heads) {
  if (g_tuning.path == 1) return Path::kStreamK;
  if (g_tuning.path == 2 && num_kv_heads <= 2) return Path::kCluster;
  switch (num_kv_heads) {
    case 2: return Path::kCluster;
    default: return Path::kStreamK;
  }
}

}  // namespace

namespace qkv_front_tuning {
void set(const Tuning& t) { g_tuning = t; }
Tuning get() { return g_tuning; }
int max_active_clusters(int nt, int ctas) {
  const unsigned smem = nt == 1 ? ClusterLayout<1>::kSmemBytes : ClusterLayout<2>::kSmemBytes;
  const detail::LaunchShape shape{dim3(36 * ctas), dim3(kThreads), smem, ctas};
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config = detail::runtime_config(shape, attr);
  int n = 0;
  cudaError_t err;
  if (nt == 1) {
    if ((err = prepare_cluster_kernel<1>())) return -static_cast<int>(err);
    err = cudaOccupancyMaxActiveClusters(&n, qkv_front_cluster_kernel<1>, &config);
  } else {
    if ((err = prepare_cluster_kernel<2>())) return -static_cast<int>(err);
    err = cudaOccupancyMaxActiveClusters(&n, qkv_front_cluster_kernel<2>, &config);
  }
  return err ? -static_cast<int>(err) : n;
}
}  // namespace qkv_front_tuning

int prepare_qkv_front() {
  if (!encode_tiled()) return static_cast<int>(cudaErrorNotSupported);
  if (cudaError_t err = prepare_kernel<1>()) return static_cast<int>(err);
  if (cudaError_t err = prepare_kernel<2>()) return static_cast<int>(err);
  if (cudaError_t err = prepare_cluster_kernel<1>()) return static_cast<int>(err);
  return static_cast<int>(prepare_cluster_kernel<2>());
}

int launch_qkv_front(const QkvFrontParams& p, Stream stream) {
  if (p.num_tokens < 1 || p.num_tokens > kFrontMaxTokens || p.num_ctas < 1 || p.workspace == nullptr)
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  // Flat dispatch: kernel by KV-head count, then 8 tokens (the verify step)
  // and fewer take one n-tile.
#ifdef MUSE_QKV_FRONT_DIAG_FORCE_NT2
  const bool one_tile = false;
#else
  const bool one_tile = p.num_tokens <= 8;
#endif
  cudaError_t err;
  switch (path_for(p.num_kv_heads)) {
    case Path::kCluster: err = one_tile ? launch_cluster<1>(p, s) : launch_cluster<2>(p, s); break;
    default: err = one_tile ? launch<1>(p, s) : launch<2>(p, s); break;
  }
  return static_cast<int>(err);
}

}  // namespace muse_decode
