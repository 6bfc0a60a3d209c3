// attn2 kernel: the 64 query rows (8 tokens x 8 heads) of one (request, KV
// head) against its paged keys, o-norm and sigmoid gate fused (SPEC section 5).
// One source, two key loops: wgmma on sm_90a (the H200), mma.sync on sm_100a
// (no wgmma there; MUSE_ATTN2_WGMMA=0 builds it on sm_90a too).
//
// Work decomposition. A cluster of C CTAs (16 on the one-slice path and at
// 1-2 KV heads, else 8) owns one key slice of one (request, KV head); all
// slices of that pair share its visible pages, round-robin from the
// device-side length L, and the number of slices in use grows with L (every
// CTA derives it from L alone; where the grid fills the GPU exactly, the
// grid's last cluster, placed last, takes fewer tiles, none at shorter L; at
// long L with one request the slices go to the clusters interleaved over the
// KV heads, and then the last two clusters take fewer tiles; one slice with a
// few more tiles than warpgroups gives the two-tile warpgroups the oldest
// tiles in pairs, and one tile more of at most 2 pages, as under a 2048-key
// window, goes in pieces of 8 keys into the passes of the second warpgroups
// of the last 2-4 CTAs). Launches with one slice (num_splits 1) run their
// own instantiation, without the split path.
// Each CTA keeps an online-softmax state (m, l, unnormalised O) of
// all 64 rows; the cluster merges its C states through distributed shared
// memory: CTA rank r owns rows [r*64/C, ...), and every CTA stores those rows
// of its state into rank r's shared memory (O in fp16, each row scaled by a
// power of 2; st.async, completing on rank r's mbarrier). Where no warpgroup
// of the cluster fills its last stage (which holds the receive area), every
// CTA pushes as soon as its own key loop is done; otherwise once the
// cluster's are.
// One slice: that CTA applies norm and gate and writes out. Several slices:
// it writes its rows' partial to the workspace (each word marks itself
// written); where the whole grid is on the GPU at once, the last active slice
// merges, polling the others' words, else the slice with the last ticket on
// the (pair, rank) counter does. The merger merges every slice's partial of
// those rows in slice order (the same bits whatever the arrival order),
// writes out and leaves counter and partials at 0 for the next launch.
//
// wgmma path. Each warpgroup (warps 0-3, 4-7) consumes its own 64-key tiles
// (4 pages) through 3 stages: warp 0 of the warpgroup copies a page's K and
// V boxes by TMA (5-D tensor map of the cache, 128-byte swizzle), S = Q K^T
// and O += P V run as wgmma m64n64k16 (Q, K, V from shared memory, P from
// registers), and the next tile's S overlaps the current P V. A
// warpgroup's tiles after its first take their softmax against the row max
// it already holds (later_softmax: no max, shuffles or rescale per tile;
// a score far above that max sends the warp through the usual step). Under
// PDL the pages of each warpgroup's first tile that hold only keys older
// than the step's 8 are copied before griddepcontrol.wait, the others
// after it.
//
// mma.sync path. Warp 0 also produces: it copies whole 4 KB (page, KV head)
// slots with cp.async.bulk, one 8-page group per stage, 3 stages. Warps w and
// w + 4 own rows w*16.. (two heads x 8 tokens) and take keys 0-7 and 8-15 of
// every page with mma.sync m16n8k16. A key row is 256 bytes, so the 8 rows an
// ldmatrix reads of one page would fall on the same banks: one 8x8 matrix
// takes key t of each of the group's 8 pages instead, and the 8 page slots
// sit 4096 + 16 bytes apart (8 different 16-byte bank groups); an mma's n
// (for S) or k (for P V) index is then the page within the group.
//
// In both, the two halves' (warpgroups') states merge in shared memory in a
// fixed order before the cluster merge.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <type_traits>

#include "../common/launch.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/tensor_map_cache.h"
#include "attn2_kernels.h"
#include "muse_decode/attn2.h"

namespace muse_decode {
namespace {

constexpr int kRows = kVerifyLen * kHeadsPerKvHead;        // 64 query rows per (request, KV head)
// Key halves: warps w and w + 4 own the same 16 rows and split each page's 16
// keys (w: keys 0-7, w + 4: keys 8-15), so a warp's S tile is 16 x 64 (32
// registers, not 64). 8 warps of <= 128 registers, two CTAs per SM: 4 warps
// per scheduler instead of 2 (v3 issued 38% of cycles, its warps stalled on
// their own ldmatrix -> mma -> exp chains). MUSE_ATTN2_KEY_SPLIT=1 builds v4.
#ifndef MUSE_ATTN2_KEY_SPLIT
#define MUSE_ATTN2_KEY_SPLIT 2
#endif
constexpr int kKeySplit = MUSE_ATTN2_KEY_SPLIT;
constexpr int kRowWarps = 4;                               // 16 rows each
constexpr int kWarps = kRowWarps * kKeySplit;              // warp 0 also issues the copies
constexpr int kThreads = kWarps * 32;
[[maybe_unused]] constexpr int kKeyTiles = 16 / kKeySplit;                  // n-tiles of S per warp (keys of a page)
// Stages per warpgroup (wgmma path). MUSE_ATTN2_WG_STAGES=6 (token st6, an
// experiment) holds 12 tiles (192 KB) per CTA, one CTA per SM.
#ifndef MUSE_ATTN2_WG_STAGES
#define MUSE_ATTN2_WG_STAGES 3
#endif
constexpr int kMinBlocks = MUSE_ATTN2_WG_STAGES > 3 ? 1 : 2;  // CTAs per SM
static_assert(kKeySplit == 1 || kKeySplit == 2, "a page's 16 keys go to one or two warps");
constexpr int kGroupPages = 8;                             // pages per stage: one per bank group
[[maybe_unused]] constexpr int kGroupKeys = kGroupPages * kPageSize;        // 128
constexpr int kStages = 3;
constexpr int kKeyBytes = kCacheRowWidth * 2;              // 256: K | V of one key
constexpr int kPageBytes = kPageSize * kKeyBytes;          // 4096: one (page, KV head) slot
constexpr int kSlotBytes = kPageBytes + 16;                // staggered by one bank group
constexpr int kStageBytes = kGroupPages * kSlotBytes;      // 32896
constexpr int kSmemBytes = kStages * kStageBytes;          // 98688: two CTAs per SM
constexpr int kMergeStride = kHeadDim + 4;                 // floats per merge row (16-byte aligned, fewer conflicts)
// The cluster merge reads each CTA's O from the others' shared memory: in
// fp32 that is 16 KB per CTA, and the SM-to-SM network moves only ~15-20
// bytes per clock and SM (bench/micro/dsmem.cu: attn2's pattern takes 1.1 us
// at 224 CTAs, 0.8 with half the bytes). So a CTA leaves its O there in fp16,
// each row scaled by a power of 2 that brings its largest |O| into [1, 2)
// (exact; the row's 2^e goes beside m and l): 2^-11 relative to the row's
// largest value, whatever the magnitude of V. (The fp32 form, the pull
// merge and the earlier split merges were removed in the twelfth session;
// bench/NOTES-attn2.md keeps their numbers, git history their code.)
constexpr int kMergeStrideH = kHeadDim + 8;                // halves per fp16 merge row (144 B: conflict-free stores)
constexpr int kQStride = kHeadDim + 8;                     // bf16 per Q row in shared memory: 144 B, conflict-free ldmatrix
// log2(e) * softmax scale: scores live in the log2 domain, exp2 on the MUFU.
constexpr float kScaleLog2 = static_cast<float>(0.6841258107984375 * 1.4426950408889634);

static_assert(kHeadDim == 64, "attn2 hard-wires head_dim 64: 4 k-steps of 16 for S, 8 n-tiles of 8 for O");
static_assert(kHeadsPerKvHead == 8 && kVerifyLen == 8,
              "attn2 hard-wires 8 heads x 8 tokens = 64 rows: 4 warps x m16");
static_assert(kPageSize == 16, "a page is 16 keys: one n-tile pair of S per key position");
static_assert(kRows * kMergeStride * 4 + kThreads / kKeySplit * 36 * 4 <= kSmemBytes,
              "the merge area and the key-half exchange reuse the stages");
static_assert(kSlotBytes % 16 == 0 && kStageBytes % 128 == 0, "bulk copies need 16-byte alignment");
constexpr int kMmaSmemBytes = kSmemBytes + kRows * kQStride * 2;  // stages, then the Q tile

// sm_90a: wgmma. Each warpgroup (warps 0-3, 4-7) is a consumer of its own
// 64-key tiles (4 pages): S = Q K^T as 4 wgmma m64n64k16 with Q and K from
// shared memory, O += P V as 4 more with P from registers and V from shared
// memory, so every K/V byte is read from shared memory once per warpgroup
// (ldmatrix read it 4 times) and the tensor cores run beside the softmax of
// the other warpgroups. A tile's K and V arrive by TMA from a 5-D tensor map
// over the cache (elements, K|V, key, KV head, page), one 2 KB box per page
// and half, 128-byte swizzled: the layout wgmma reads without bank conflicts.
#ifndef MUSE_ATTN2_WGMMA
#define MUSE_ATTN2_WGMMA 1
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL) && MUSE_ATTN2_WGMMA
#define MUSE_ATTN2_WGMMA_PATH 1
#else
#define MUSE_ATTN2_WGMMA_PATH 0
#endif
// Pages per CTA and slice before another slice joins (the split path's
// active slices grow with L in steps of kSlicePages * cluster pages).
#ifndef MUSE_ATTN2_SLICE_PAGES
#define MUSE_ATTN2_SLICE_PAGES 8
#endif
[[maybe_unused]] constexpr int kSlicePages = MUSE_ATTN2_SLICE_PAGES;
constexpr int kTilePages = 4;                               // wgmma tile: 64 keys
constexpr int kTileKeys = kTilePages * kPageSize;
constexpr int kWgStages = MUSE_ATTN2_WG_STAGES;             // per warpgroup
constexpr int kHalfBytes = kTileKeys * kHeadDim * 2;        // 8192: K (or V) of a tile
constexpr int kWgStageBytes = 2 * kHalfBytes;               // K then V
// Tiles per warpgroup copied before griddepcontrol.wait (of its kWgStages, 3 by default).
// One: the copies of all 3 stages (21 MB at TP8 128k) fill the memory system
// while the kernel before still merges, and its tail's round trips wait
// behind them (TP8 128k 27.1 -> 25.9 us, 32k 12.2 -> 11.7 with one).
#ifndef MUSE_ATTN2_EARLY_TILES
#define MUSE_ATTN2_EARLY_TILES 1
#endif
[[maybe_unused]] constexpr int kEarlyTiles = MUSE_ATTN2_EARLY_TILES;
// One slice with up to twice as many tiles as warpgroups: the two-tile
// warpgroups take the oldest tiles in pairs (see r_two), not round-robin as
// at every other length.
// One-slice kernel, one tile more than warpgroups, and that tile holds at
// most kTailPages pages (a 2048-key window: 129 or 130 pages, 32 x 4 + 1 or
// 2): its keys join the passes of whole tiles in pieces of 8 (below),
// instead of any warpgroup taking two whole tiles (the pairs above). (Before v25 the tail was a pass of its own after
// warpgroup 0's tile, removed in the thirteenth session; v25's whole tail
// in the last warpgroup's pass (m64n64 + m64n32) was removed in the
// fourteenth; bench/NOTES-attn2.md.)
[[maybe_unused]] constexpr int kTailPages = 2;  // (the mma.sync path never uses it)
// The odd tile in pieces of 8 keys (2 per page), each joining the pass of
// one warpgroup's own tile as N = 8 (S m64n64 + m64n8, one softmax over 72
// keys, P V in 5 k-steps, the piece page's other 8 keys at P = 0): at the
// window's new end, to the second warpgroups of the last 2 or 4 CTAs,
// window 2048 3.97-4.00 -> 3.80-3.82 us against v25's whole tail (v31);
// pieces to both warpgroups of the last CTA had made it 0.08 us slower
// (both then wait for the tail's copy after griddepcontrol.wait).
// The odd 1-2 pages at the window's old end, not its new one (v33): the 32
// whole tiles end at the newest page, as without a window (the last one's
// page with this step's keys copied after the wait, v30), and the extra
// pages are the oldest ones, whose keys only the first rows see. So the
// pieces' copies go before griddepcontrol.wait with their warpgroups' own
// tiles, and none of them waits for a post-wait copy. Pieces wholly below
// the window are dropped; the rest go to the second warpgroups of the first
// CTAs (v31 had them at the new end).
// A piece's pass masks its tile only where tile_ready says the tile needs it
// (the piece always), not all 72 keys.
// A warpgroup's tiles after its first: softmax against the row max it holds
// (later_softmax, v37), not every tile its own row max and O's rescale.
// Where every slice is in use (one request, the wgmma path) the clusters'
// (slice, KV head) interleave (see `interleaved` in the kernel), not slice
// blockIdx.x / C of head blockIdx.y.
// A first tile that holds this step's keys is copied in two parts, its older
// pages before griddepcontrol.wait, not all of it after.
// The interleaved slice's first page ids load with L's, not after it.
// (The older forms of each, and what they measured: bench/NOTES-attn2.md.)

// How many tiles fewer per warpgroup the grid's last cluster takes, placed
// late under PDL (idle_last_cluster: it started 2.5-3.5 us late in v14's
// trace), and from how many round-robin rounds on (below that it takes its
// full share). TP8 PDL us, same call: 32k 10.85-10.96 with 2 tiles fewer
// (which left it nothing there), 11.06-11.09 with 1, 10.80-10.81 with its
// full share; 128k 24.20-24.30 / 23.87-23.91 / 24.47-24.59. Since v37 (the
// other clusters' later tiles cheaper) 2 fewer from the fourth round on
// (v38): 128k 22.28-22.45 against 22.75-22.97 with 1, 22.40-22.90 with 3,
// 22.98-23.11 with 4, 23.61-23.80 with none; 32k the same with each.
#ifndef MUSE_ATTN2_LATE_TILES
#define MUSE_ATTN2_LATE_TILES 2
#endif
#ifndef MUSE_ATTN2_LATE_MIN_ROUNDS
#define MUSE_ATTN2_LATE_MIN_ROUNDS 4
#endif
[[maybe_unused]] constexpr int kLateTiles = MUSE_ATTN2_LATE_TILES;  // (the mma.sync path never uses these)
[[maybe_unused]] constexpr int kLateMinRounds = MUSE_ATTN2_LATE_MIN_ROUNDS;

// The cluster merge pushes instead of pulling: each CTA arrives on the
// cluster barrier as soon as its key loop is done (its stages are free), and
// once every CTA has arrived it stores each row of its state into the owning
// CTA's receive area with st.async, which completes on the owner's mbarrier.
// One one-way trip over the SM-to-SM network instead of a barrier round and a
// load round trip, the barrier's wait overlapping the halves' merge, and no
// barrier before exit (nobody reads another CTA's shared memory).
// After the key loop the stages hold the merge area (64 rows of O) and the
// key-half exchange (9 float4 per thread of the second half), then the
// receive area: per source rank and owned row, 64 halves of O, then per
// (rank, row) m, l, 2^e.
constexpr int kExchangeEnd = kRows * kMergeStride * 4 + kThreads / 2 * 36 * 4;
constexpr int kRecvOffset = (kWgStages - 1) * kWgStageBytes + 4096;  // in warpgroup 0's last stage (36 KB with 3)
constexpr int kRecvBytes = kRows * (kHeadDim * 2 + 16);  // 9216: C ranks x 64 / C rows
static_assert(kExchangeEnd <= kRecvOffset, "receive area past the exchange");

// Where no warpgroup fills its last stage (short L), the push starts as soon
// as the CTA's own key loop is done (see early_push), not once every CTA of
// the cluster is past its loop.
// PDL trigger: where every key loop of the launch is short (the one-slice
// kernel always, right after its wait: below; the general kernel where
// early_push holds, known once L is read, before its wait), the next launch
// may start early, so that its CTAs read their lengths and block table and
// issue their first copies while this one computes; elsewhere after the key
// loop (at the start there: TP8 32k +0.2,
// 128k +0.45 us). 0 (token et0): always after the key loop.
#ifndef MUSE_ATTN2_EARLY_TRIGGER
#define MUSE_ATTN2_EARLY_TRIGGER 1
#endif
// The one-slice kernels trigger right after their griddepcontrol.wait, not at
// their start: launches then run at most two
// deep instead of as many as fit on the GPU (~8 of 32 CTAs; a call's CTAs
// enter ~2.2 us before the previous call ends instead of ~20), and the
// steady-state period is shorter (trace build, max_model_len 2048: median
// 3.46 against 3.52 us; why, not known). max_model_len 2048 3.28-3.29 us
// against 3.29-3.34, window 3.47-3.50 against 3.50-3.51. (The same in the
// general kernel where early_push holds: 2k and 8k 0.1 us slower.) The wgmma
// path only: the mma.sync path waits first thing and triggers at its start.
constexpr bool kTriggerAfterWait = MUSE_ATTN2_WGMMA_PATH;
// Clusters of 16 (wgmma path, rows of 32 merger threads): the cluster
// merge's push goes straight from the first warpgroup's registers (each
// thread's 2 rows x 16 columns, 2 x 16 bytes per row; the receive area in
// two halves of n-tiles, each in the fragment's order, so that a warp
// instruction writes two runs of 256 bytes), not through an fp16 copy of O
// in shared memory; the mergers map positions back to columns (v34, one-slice
// kernels: window -0.04 us, max_model_len 2048 -0.05; then 8k lost 0.1 in the
// general kernel; v39, the general kernel too: 2k -0.06, 8k +0.02, 32k and
// 128k the same). Clusters of 8 (4 columns per merger thread) and the
// mma.sync path push through shared memory.
// The cluster barrier's arrival that opens this CTA's receive area to the
// other ranks' pushes is relaxed. It must publish the receive mbarrier's
// initialisation, which fence.mbarrier_init.release.cluster after the init
// already does (the PTX ISA's pattern: that fence, then a relaxed arrive);
// and this CTA's reads of the stage under the receive area have all returned
// by then (wgmma waited for, ldmatrix results consumed). The release form
// compiles to MEMBAR.ALL.GPU on every thread, on the chain after the key
// loop (v40: TP8 32k -0.3 us, 128k -0.4).
// The gate's sigmoid before the cluster merge's wait where every loop is short
// (below), else after the merges.

// Split merge: the partials' words carry their own "written" mark (see the
// kernel's split path), and the merger merges each round in two passes, the
// round's max first, then the weighted sums. Where the host says the whole
// grid is co-resident (p.resident), the last active slice merges by polling,
// without the ticket: at 8k it holds the step's newest keys (copied after the
// wait) and so tends to finish last (v28: 0.05-0.1 us before slice 0 there);
// elsewhere the CTA with the last ticket merges.
// The work after the key loop (the cluster merge of a CTA's rows, the split
// merge, the o-norm and gate) runs on 32 threads per row with 2 columns each
// where the first warpgroup has that many threads (clusters of 16: 4 rows per
// CTA), else on 16 threads with 4 columns: its chains are latency-bound, so
// half the columns per thread shortens them.
constexpr int kQTileBytes = kRows * kHeadDim * 2;           // 8192, swizzled like K
constexpr int kWgSmemBytes = 2 * kWgStages * kWgStageBytes + kQTileBytes + 1024;  // + 1 KB to align to 1024
constexpr int kDynSmemBytes = kMmaSmemBytes > kWgSmemBytes ? kMmaSmemBytes : kWgSmemBytes;
constexpr int kBarriers = 2 * kWgStages > kStages ? 2 * kWgStages : kStages;
static_assert(kExchangeEnd <= 2 * kWgStages * kWgStageBytes,
              "the merge area and the warpgroup exchange reuse the stages");
static_assert(kRecvOffset + kRecvBytes <= kSmemBytes && kRecvOffset + kRecvBytes + 1024 <= 2 * kWgStages * kWgStageBytes,
              "the receive area lies in the stages of both paths");
static_assert(kMinBlocks * (kDynSmemBytes + 2560 + 1024) <= 228 * 1024,
              "kMinBlocks CTAs per SM (stages, the Q tile, barriers, gate and merge state, 1 KB reserved each)");

// ---- PTX wrappers ------------------------------------------------------------------

// The shared-memory barriers of ../common/sm90_mbarrier.cuh, taken by pointer.
using detail::smem_addr;
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) { detail::mbar_init(smem_addr(bar), count); }
// (Its own wait: the try-wait loop inside one asm block. The shared form, a
// C++ loop around a selp, gives this kernel other SASS.)
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { detail::mbar_arrive(smem_addr(bar)); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  detail::mbar_expect_tx(smem_addr(bar), bytes);
}

#if !MUSE_ATTN2_WGMMA_PATH  // the mma.sync path
// Global -> shared bulk copy completing on `bar` (bytes a multiple of 16).
// The KV cache is read once per step: evict it first from the L2.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
      "%4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

#endif

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

#if MUSE_ATTN2_WGMMA_PATH  // the wgmma path (sm_90a)
// Global -> shared tensor copy of one box through the 5-D cache map,
// completing on `bar`; evict-first in the L2 like the bulk copies.
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            int c4, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3, %4, %5, %6}], [%7], %8;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(bar)),
      "l"(policy)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The warpgroup MMA wrappers (descriptors, fences, m64n64k16 / m64n8k16 from
// shared memory, m64n64k16 with A in registers): ../common/sm90_wgmma.cuh.
using ptx::pin;
using ptx::pin_a;
using ptx::sw128_desc;
using ptx::wgmma_commit;
using ptx::wgmma_fence;
using ptx::wgmma_rs;
using ptx::wgmma_ss;
using ptx::wgmma_wait;
#endif

// ldmatrix and mma.sync: the mma.sync path's, and (wgmma path) the slow path
// of later_softmax.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
#if MUSE_ATTN2_WGMMA_PATH  // (scores_again)
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
#endif

#if !MUSE_ATTN2_WGMMA_PATH
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
#endif

// d += a * b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scores of keys a row does not see (past its position, below its window)
// become -inf; key(t, e) is the key of this thread's element e of n-tile t.
// A select, so NaN keys past L vanish too.
template <int N, typename KeyOf>
__device__ __forceinline__ void mask_tile(float (&s)[N][4], KeyOf key, int pos, int window) {
#pragma unroll
  for (int t = 0; t < N; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key(t, e);
      const bool visible = j <= pos && (window == 0 || j > pos - window);
      s[t][e] = visible ? s[t][e] : -INFINITY;
    }
}

// O (an m64n64 accumulator fragment) of this thread's rows r = 0 (c0, c1) and
// r = 1 (c2, c3) times the rows' alpha: the online softmax's rescale.
__device__ __forceinline__ void rescale(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// P of one S tile in place, p = exp2(s * c + neg_mc) (rows r = 0: c0, c1;
// r = 1: c2, c3), each row's p added to sum[r] in n-tile order.
template <int N>
__device__ __forceinline__ void exp2_tile(float (&s)[N][4], const float (&neg_mc)[2], float (&sum)[2]) {
#ifdef MUSE_ATTN2_DIAG_NO_EXP  // timing only (wrong results): the scores' exp2 replaced by one FMA
#define fast_exp2(x) fmaf((x), 1e-3f, 0.5f)
#endif
#pragma unroll
  for (int t = 0; t < N; ++t) {
    s[t][0] = fast_exp2(fmaf(s[t][0], kScaleLog2, neg_mc[0]));
    s[t][1] = fast_exp2(fmaf(s[t][1], kScaleLog2, neg_mc[0]));
    s[t][2] = fast_exp2(fmaf(s[t][2], kScaleLog2, neg_mc[1]));
    s[t][3] = fast_exp2(fmaf(s[t][3], kScaleLog2, neg_mc[1]));
#ifndef MUSE_ATTN2_DIAG_NO_SUM  // (timing only, wrong results: no row sums)
    sum[0] += s[t][0] + s[t][1];
    sum[1] += s[t][2] + s[t][3];
#endif
  }
#ifdef MUSE_ATTN2_DIAG_NO_EXP
#undef fast_exp2
#endif
}

// Online softmax of one S tile in place, on raw scores: p = exp2(s * c - m * c)
// with c = scale * log2(e), one FFMA per score. This thread holds rows r = 0
// (columns c0, c1 of each n-tile) and r = 1 (c2, c3); the 4 lanes of a row hold
// disjoint columns. Updates the rows' running max and sum and returns in alpha
// the factor their O must take.
template <int N>
__device__ __forceinline__ void online_softmax(float (&s)[N][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&alpha)[2]) {
#ifdef MUSE_ATTN2_DIAG_NO_SOFTMAX  // timing only (wrong results): P = S / 1000, no max, exp2 or sums
#pragma unroll
  for (int t = 0; t < N; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[t][e] *= 1e-3f;
  alpha[0] = alpha[1] = 1.0f;
  m_run[0] = m_run[1] = 0.0f;
  l_run[0] = l_run[1] = 1.0f;
  return;
#endif
  float mx[2] = {-INFINITY, -INFINITY};
#ifdef MUSE_ATTN2_DIAG_NO_MAX  // timing only (wrong results): no row max, 0 instead
  mx[0] = mx[1] = 0.0f;
#else
#pragma unroll
  for (int t = 0; t < N; ++t) {
    mx[0] = fmaxf(mx[0], fmaxf(s[t][0], s[t][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[t][2], s[t][3]));
  }
#endif
  float neg_mc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#ifndef MUSE_ATTN2_DIAG_NO_MAX
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
#endif
    const float m_new = fmaxf(m_run[r], mx[r]);
    const float mu = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet stays at zero
    alpha[r] = fast_exp2((m_run[r] - mu) * kScaleLog2);
    neg_mc[r] = -mu * kScaleLog2;
    m_run[r] = m_new;
    l_run[r] *= alpha[r];
  }
  exp2_tile(s, neg_mc, l_run);
}

#if MUSE_ATTN2_WGMMA_PATH
// A warpgroup's later tiles (v37): their softmax against the row max the
// warpgroup already holds, without a max of their own: no FMNMX chain, no
// shuffles and no rescale of O on the usual path (TP8 128k -0.45 us, 32k
// -0.18; TP1 x 8 128k -6%). P = exp2(s * c - m * c) and its sums are exact in
// any scale fp32 holds, so only a score far above m needs the usual step:
// where a row's running sum would pass kFarSum (some p near 2^32 or inf; O
// stays far from fp32's limit below it), or a row has no m yet (nothing
// visible in its first tile), this returns true with s no longer holding
// scores and l_run untouched, and the caller computes the tile's scores again
// and takes online_softmax. Otherwise s holds P and l_run its sums.
// Warp-uniform.
constexpr float kFarSum = 0x1p32f;
template <int N>
__device__ __forceinline__ bool later_softmax(float (&s)[N][4], const float (&m_run)[2], float (&l_run)[2]) {
  const bool no_m = m_run[0] == -INFINITY || m_run[1] == -INFINITY;
  const float neg_mc[2] = {-m_run[0] * kScaleLog2, -m_run[1] * kScaleLog2};
  float ts[2] = {0.0f, 0.0f};  // this tile's sums
  exp2_tile(s, neg_mc, ts);
  if (__any_sync(0xFFFFFFFFu, fmaxf(l_run[0] + ts[0], l_run[1] + ts[1]) > kFarSum || no_m)) return true;
  l_run[0] += ts[0];
  l_run[1] += ts[1];
  return false;
}

// The raw scores of one 64-key tile again, on this warp's tensor cores:
// mma.sync m16n8k16, whose accumulators hold the same elements as wgmma's
// m64n64 does for the warp's 16 rows. Q rows rw*16.. of q_tile, the keys of
// k_tile, both 1024-byte aligned, 128 bytes per row and 128-byte swizzled
// (16-byte chunk c of row r at (c ^ r % 8) * 16; every row this lane
// addresses has r % 8 = lane % 8). Slow path of later_softmax only: one
// k-step at a time, few registers.
__device__ __forceinline__ void scores_again(float (&s)[8][4], uint32_t q_tile, uint32_t k_tile, int rw, int lane) {
  const int sw = lane % 8;
#pragma unroll
  for (int t = 0; t < 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
  // A: matrices (rows 0-7, 8-15) x (dims 0-7, 8-15) of the k-step; lane i gives row i % 8 of matrix i / 8.
  const uint32_t q_row = q_tile + (rw * 16 + sw + (lane / 8) % 2 * 8) * 128;
  // B: keys 8t + lane % 8 (t * 1024 bytes on), chunks 2ks and 2ks + 1 from lanes 0-7 and 8-15.
  const uint32_t k_row = k_tile + sw * 128;
#pragma unroll 1
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, q_row + (((2 * ks + lane / 16) ^ sw) << 4));
    const uint32_t kb = k_row + (((2 * ks + (lane / 8) % 2) ^ sw) << 4);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      uint32_t b[2];
      ldmatrix_x2(b, kb + t * 1024);
      mma_bf16(s[t], a, b[0], b[1]);
    }
  }
}
#endif

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 4 columns of a CTA's fp16 (scaled) O, as two 32-bit words.
__device__ __forceinline__ float4 half4_to_float4(uint32_t lo, uint32_t hi) {
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  return make_float4(a.x, a.y, b.x, b.y);
}
// 16 bytes into CTA `rank`'s shared memory at `addr` (this CTA's address of
// the same spot), completing `bytes` on that CTA's mbarrier at `bar`.
__device__ __forceinline__ void push_v4(uint32_t addr, uint4 v, uint32_t bar, int rank) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   detail::map_to_rank(addr, rank)),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(detail::map_to_rank(bar, rank))
               : "memory");
}
// The split path's partials in the workspace, for the ticket merge: every
// 32-bit word is stored inverted, so that 0 (what the caller's zeroing and
// every merge leave behind) reads as "not written yet" and a word, once
// nonzero, is the value itself; no fence or flag orders the words. The one
// value whose inverse is 0, the NaN 0xFFFFFFFF, is stored as the NaN 0x7FFFFFFF.
__device__ __forceinline__ uint32_t ws_word(float v) {
  const uint32_t b = __float_as_uint(v);
  return ~(b == 0xFFFFFFFFu ? 0x7FFFFFFFu : b);
}
__device__ __forceinline__ void st_ws(float4* at, float4 v) {
  asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(ws_word(v.x)), "r"(ws_word(v.y)),
               "r"(ws_word(v.z)), "r"(ws_word(v.w))
               : "memory");
}
__device__ __forceinline__ void st_ws(float2* at, float2 v) {
  asm volatile("st.relaxed.gpu.global.v2.b32 [%0], {%1, %2};" ::"l"(at), "r"(ws_word(v.x)), "r"(ws_word(v.y)) : "memory");
}
__device__ __forceinline__ void clear_ws(float4* at) {
  asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1, %1, %1, %1};" ::"l"(at), "r"(0u) : "memory");
}
__device__ __forceinline__ void clear_ws(float2* at) {
  asm volatile("st.relaxed.gpu.global.v2.b32 [%0], {%1, %1};" ::"l"(at), "r"(0u) : "memory");
}
__device__ __forceinline__ uint4 ld_ws(const float4* at) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(at) : "memory");
  return v;
}
__device__ __forceinline__ uint2 ld_ws(const float2* at) {
  uint2 v;
  asm volatile("ld.relaxed.gpu.global.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(at) : "memory");
  return v;
}
__device__ __forceinline__ float ws_value(uint32_t w) { return __uint_as_float(~w); }

__device__ __forceinline__ void wait_for_producer() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_for_push() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// A grid that fills the GPU exactly has its last cluster placed last: after
// the kernel before has drained, under PDL 3-4 us after the others (TP8,
// 14 clusters of 16; the trace in bench/NOTES-attn2.md), and its loads then
// queue behind everyone's tile copies. Where every slice would be in use
// (host: idle_last), that cluster's warpgroups take kLateTiles fewer tiles
// than the others from kLateMinRounds round-robin rounds on, and their full
// share below that (wgmma path); on the mma.sync path none: its pair then
// takes one slice fewer and it leaves at once.
// With the slices interleaved (wgmma path, one request) the grid's last two
// clusters are the last slice of the last two KV heads, and both are placed
// late (TP8 128k trace: the previous call's mergers hold slots in two SM
// groups until it ends); both then take fewer tiles.
// Depends only on the deployment and L: the merge order stays fixed.
// One-slice launches without a window (max_model_len <= 2048) run a kernel
// of their own (attn2_kernel's kWindow = false), without the window's code:
// its tail (only a window makes a one-slice tail) and its masks. TP8
// max_model_len 2048: 3.60-3.62 -> 3.41-3.42 us (v32). The general kernel's
// counterpart measured within noise at 2k-128k and is not built.
__device__ __forceinline__ bool idle_last_cluster(const Attn2Params& p, int active, int kvh, int req,
                                                  bool interleaved = false) {
  const int late_heads = interleaved ? 2 : 1;
  return p.idle_last && active == p.num_splits && active > 2 &&
         kvh >= p.num_kv_heads - late_heads && req == p.num_reqs - 1;
}

// The cluster merge of one row, in rank order: ok[k] holds this thread's
// kCols columns of rank k's O (from fp16, scaled), mls[k * stride] rank k's
// (m, l, 2^e) in this CTA's shared memory (the push merge's receive area).
// Each thread loads all of them and computes every weight itself (v26: a
// max by shuffles and the weights shuffled round from the row's lanes put
// 32 more shuffles on the chain).
template <int kCluster, int kCols>
__device__ __forceinline__ void combine_ranks_local(const float (&ok)[kCluster][kCols], const float4* mls, int stride,
                                                    float& m_all, float& l_all, float (&acc)[kCols]) {
  float4 v[kCluster];
#pragma unroll
  for (int k = 0; k < kCluster; ++k) v[k] = mls[k * stride];
  static_assert(kCluster == 8 || kCluster == 16, "clusters of 8 or 16");
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
  m_all = fmaxf(mx[0], mx[1]);
#pragma unroll
  for (int k = 0; k < kCluster; ++k) {
    const float w = v[k].x == -INFINITY ? 0.0f : fast_exp2(v[k].x - m_all);
    l_all = fmaf(w, v[k].y, l_all);
    const float wo = w * v[k].z;  // rank k's O weight: its softmax weight times its row's 2^e
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = fmaf(wo, ok[k][c], acc[c]);
  }
}


// sigmoid of kCols gate columns (bf16, the first kCols of g): known before
// the merges, so computed while they are in flight.
template <int kCols>
__device__ __forceinline__ void gate_sigmoid(const uint2 g, float (&sg)[kCols]) {
  const float2 g01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g.x));
  const float2 g23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g.y));
  const float gv[4] = {g01.x, g01.y, g23.x, g23.y};
#pragma unroll
  for (int k = 0; k < kCols; ++k) sg[k] = 1.0f / (1.0f + __expf(-gv[k]));
}

// out = bf16(sigmoid(gate) * o * rsqrt(mean(o^2) + eps)) for kCols columns of
// a row whose 64 columns are spread over kRowThreads consecutive lanes; sg
// from gate_sigmoid.
// (Given O's unnormalised sums and l: o / l * rsqrt(mean((o / l)^2) + eps) =
// o * rsqrt(mean(o^2) + eps l^2) for l > 0, so no division waits on l; a NaN l
// (a broken row) still makes the row NaN. 2k, 8k, max_model_len 2048 0.03-0.04
// us less than dividing first.)
template <int kRowThreads, int kCols>
__device__ __forceinline__ void finish_row(const float (&o)[kCols], float l, const float (&sg)[kCols], __nv_bfloat16* out) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kCols; ++k) ss = fmaf(o[k], o[k], ss);
#pragma unroll
  for (int m = 1; m < kRowThreads; m <<= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, m);
  const float rms = rsqrtf(fmaf(ss, 1.0f / kHeadDim, kRmsNormEps * l * l));
  float y[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) y[k] = o[k] * rms * sg[k];
  if constexpr (kCols == 4) {
    uint2 v;
    v.x = pack_bf16(y[0], y[1]);
    v.y = pack_bf16(y[2], y[3]);
    *reinterpret_cast<uint2*>(out) = v;
  } else {
    static_assert(kCols == 2, "rows of 16 or 32 threads");
    *reinterpret_cast<uint32_t*>(out) = pack_bf16(y[0], y[1]);
  }
}

// The split path's words of kCols columns (see st_ws).
template <int kCols>
__device__ __forceinline__ void st_ws_cols(float* at, const float (&v)[kCols]) {
  if constexpr (kCols == 4)
    st_ws(reinterpret_cast<float4*>(at), make_float4(v[0], v[1], v[2], v[3]));
  else
    st_ws(reinterpret_cast<float2*>(at), make_float2(v[0], v[1]));
}
template <int kCols>
__device__ __forceinline__ void ld_ws_cols(const float* at, uint32_t (&w)[kCols]) {
  if constexpr (kCols == 4) {
    const uint4 v = ld_ws(reinterpret_cast<const float4*>(at));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = ld_ws(reinterpret_cast<const float2*>(at));
    w[0] = v.x, w[1] = v.y;
  }
}
template <int kCols>
__device__ __forceinline__ void clear_ws_cols(float* at) {
  if constexpr (kCols == 4)
    clear_ws(reinterpret_cast<float4*>(at));
  else
    clear_ws(reinterpret_cast<float2*>(at));
}

// Diagnostics (-DMUSE_ATTN2_PROBE, experiments only): CTA (0, 0, 0), thread 0
// stamps %globaltimer at its phases into a ring of 16 calls; the process
// prints the last calls' phases at exit.
// -DMUSE_ATTN2_TRACE (with the probe): thread 0 of every CTA appends a record
// to a ring (phase stamps, exit, SM, CTA, block table, sequence number).
#ifdef MUSE_ATTN2_TRACE
constexpr int kTraceRing = 16384, kTraceWords = 32;  // records of 32 u64 (bench/trace_attn2.py)
__device__ unsigned long long g_ring[kTraceRing][kTraceWords];
__device__ unsigned int g_ring_n;
#define TRACE(i)                                                                                   \
  if (threadIdx.x == 0) {                                                                          \
    if ((i) == 0) {                                                                                \
      const unsigned seq_ = atomicAdd(&g_ring_n, 1u);                                              \
      trace_slot = seq_ % kTraceRing;                                                              \
      for (int k_ = 1; k_ < kTraceWords; ++k_) g_ring[trace_slot][k_] = 0;                         \
      unsigned smid_;                                                                              \
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid_));                                          \
      g_ring[trace_slot][10] = smid_;                                                              \
      g_ring[trace_slot][12] = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;     \
      g_ring[trace_slot][13] = reinterpret_cast<uintptr_t>(p.block_table);                         \
      g_ring[trace_slot][14] = seq_;                                                               \
    }                                                                                              \
    g_ring[trace_slot][i] = global_ns();                                                           \
  }
// The stamp once v has arrived (a load's value: the timer read waits for it).
#define TRACE_DEP(i, v)                                                                            \
  if (threadIdx.x == 0) {                                                                          \
    unsigned long long t_;                                                                         \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_) : "r"(static_cast<int>(v)));              \
    g_ring[trace_slot][i] = t_;                                                                    \
  }
#else
#define TRACE(i)
#define TRACE_DEP(i, v)
#endif
#ifdef MUSE_ATTN2_PROBE
__device__ unsigned long long g_probe[16][12];
__device__ unsigned int g_probe_calls;
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define PROBE(i)                                                                                   \
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) {                 \
    if ((i) == 0) probe_slot = atomicAdd(&g_probe_calls, 1u) % 16;                                   \
    g_probe[probe_slot][i] = global_ns();                                                          \
  }                                                                                                \
  TRACE(i)
#else
#define PROBE(i)
#endif

// kOneSlice: the launch has one slice (num_splits 1: max_model_len <= 2048 or
// a window), so the split path and its slice logic are compiled out.
// kWindow: the launch may have a window; false for one-slice launches
// without one, whose kernel then has neither the window's
// tail nor its masks and block-table offsets.
template <int kCluster, bool kOneSlice, bool kWindow = true>
__global__ void __launch_bounds__(kThreads, kMinBlocks) attn2_kernel(const __grid_constant__ CUtensorMap kv_map, const Attn2Params p) {
  // later_softmax where a warpgroup can hold more than one tile (not in the
  // one-slice kernels, whose extra keys go to a piece pass instead).
  [[maybe_unused]] constexpr bool kLaterMax = !kOneSlice;
  static_assert(kRows % kCluster == 0 && kRows / kCluster * 16 <= kRowWarps * 32,
                "each CTA of the cluster merges 64 / C rows, at least 16 threads per row, in its first half");

  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full_bar[kBarriers];
  __shared__ uint64_t empty_bar[kBarriers];
  __shared__ float4 s_mls[kRows];  // per row: m (log2 domain), l, 2^e of its fp16 O, -
  __shared__ int s_bad;
  __shared__ uint64_t recv_bar;  // the push merge: every rank's rows of this CTA landed
  __shared__ uint2 s_gate[kRowWarps * 32];                         // the merger threads' gate (no registers held)

#ifdef MUSE_ATTN2_PROBE
  unsigned int probe_slot = 0;
#endif
#ifdef MUSE_ATTN2_TRACE
  unsigned int trace_slot = 0;
#endif
  PROBE(0);
  [[maybe_unused]] const int window = kWindow ? p.window : 0;  // (kWindow: the launch may have one)
  const int rank = static_cast<int>(blockIdx.x) % kCluster;
  int split = static_cast<int>(blockIdx.x) / kCluster;  // (the wgmma path may interleave them, below)
  int kvh = blockIdx.y;
  const int req = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp % kRowWarps;  // row block: rows rw*16 .. rw*16 + 15 (heads 2rw, 2rw + 1)
  const int kh = warp / kRowWarps;  // key half: keys kh*kKeyTiles .. of every page

  if (threadIdx.x == 0) {
#if MUSE_ATTN2_WGMMA_PATH
    prefetch_tensor_map(&kv_map);
#pragma unroll
    for (int s = 0; s < 2 * kWgStages; ++s) {
      mbar_init(&full_bar[s], 1);
      mbar_init(&empty_bar[s], kRowWarps);  // the 4 warps of the stage's warpgroup
    }
#else
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_bar[s], 1);
      mbar_init(&empty_bar[s], kWarps);
    }
#endif
    s_bad = 0;
    mbar_init(&recv_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_arrive_expect_tx(&recv_bar, kRecvBytes);  // phase 0 ends when they all landed
  }
  __syncthreads();
  PROBE(1);
  // (Short loops only; MUSE_ATTN2_EARLY_TRIGGER=2, token et2: every launch, for an A/B.)
  if ((kOneSlice && MUSE_ATTN2_EARLY_TRIGGER && !kTriggerAfterWait) || MUSE_ATTN2_EARLY_TRIGGER == 2) allow_dependents();

#if !MUSE_ATTN2_WGMMA_PATH
  // Everything below reads what the previous kernel may have written (q,
  // gate, the cache insert, lengths, block table).
  wait_for_producer();
#endif

  // Work goes round-robin over the CTAs of the active slices (mma.sync: CTA
  // `me` takes 8-page groups me, me + ctas, ...; wgmma: warpgroup 2 me + kh
  // takes 4-page tiles). Without a window the first pages are known before
  // L arrives, so their ids load together with it (one global latency saved).
  [[maybe_unused]] const int me = split * kCluster + rank;  // (the wgmma path counts warpgroups instead)
  // Loads that do not depend on L go first, so that they overlap its latency:
  // the consumers' 16 Q rows, the gate of the rows this CTA finishes.
  constexpr int kMergeRows = kRows / kCluster;
  // kRowThreads threads per merged row, kCols columns each.
  constexpr int kRowThreads = kMergeRows * 32 <= kRowWarps * 32 ? 32 : 16;
  constexpr int kCols = kHeadDim / kRowThreads;
  const bool merger = threadIdx.x < kMergeRows * kRowThreads;
  const int row = rank * kMergeRows + threadIdx.x / kRowThreads;  // = local head * 8 + token
  const int d = (threadIdx.x % kRowThreads) * kCols;  // position in the merged row (workspace, receive area)
  constexpr bool kRegPush = MUSE_ATTN2_WGMMA_PATH && kCols == 2;
  // Its columns: the same, or (kRegPush) position 32h + 8q + 2j holds the
  // pair of columns 8n + 2q with n = 4h + j (lane quad q's n-tile n).
  const int dc = kRegPush ? (4 * (d / 32) + d % 8 / 2) * 8 + d % 32 / 8 * 2 : d;
  // (kRegPush) The receive area's O in two halves of n-tiles (0-3, 4-7), each
  // a 64-byte run per (source rank, owned row), rank-major: 4 KB per half.
  constexpr int kRecvHalfBytes = kRows * 32 * 2;
  const int token = row % kVerifyLen;
  int head = kvh * kHeadsPerKvHead + row / kVerifyLen;
  const int64_t grow = static_cast<int64_t>(req) * kVerifyLen + token;
  uint2 gate_v = make_uint2(0u, 0u);
  constexpr int kQLoads = 4 / kKeySplit;  // 16-byte loads per lane: the two warps of a row block share them
  uint4 qv[kQLoads];
  auto load_q_and_gate = [&] {
    if (merger) {
      const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(p.gate) + grow * p.gate_stride + head * kHeadDim + dc;
      if constexpr (kCols == 4)
        gate_v = *reinterpret_cast<const uint2*>(g);
      else
        gate_v.x = *reinterpret_cast<const uint32_t*>(g);
    }
    // Row block rw: rows rw*16 + r (head 2rw + r / 8, token r % 8), 8 x 16 bytes each.
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int idx = (kh * kQLoads + k) * 32 + lane, r = idx / 8, c = idx % 8;
      qv[k] = *reinterpret_cast<const uint4*>(
          static_cast<const __nv_bfloat16*>(p.q) + static_cast<int64_t>(req * kVerifyLen + r % 8) * p.q_stride +
          (kvh * kHeadsPerKvHead + 2 * rw + r / 8) * kHeadDim + c * 8);
    }
  };
#if !MUSE_ATTN2_WGMMA_PATH
  load_q_and_gate();
#endif
  const int32_t* bt = p.block_table + static_cast<int64_t>(req) * p.block_table_stride;
#if MUSE_ATTN2_WGMMA_PATH
  // Warp 0 of each warpgroup, lanes 0-3: page ids of the warpgroup's first tile.
  int vme = 2 * (split * kCluster + rank) + kh;  // this warpgroup among all of the pair's
  int ids0 = -1;
  auto load_ids0 = [&](int v) {  // warpgroup v's first tile (without a window its pages do not depend on L)
    int id = -1;
    if (rw == 0 && window == 0 && lane < kTilePages) {
      const int pi = v * kTilePages + lane;
      id = pi < (p.max_model_len + kPageSize - 1) / kPageSize ? bt[pi] : -1;  // in the table, maybe past L
    }
    return id;
  };
  ids0 = load_ids0(vme);
  // The interleaved slice's first tile too (below; whether it applies depends
  // on L, which slice it is does not), so that no second block-table load
  // waits for L: TP8 128k, the first copies 0.5 us sooner.
  const int split_il = (static_cast<int>(blockIdx.y) * p.num_splits + split) / p.num_kv_heads;
  const int ids0_il = !kOneSlice && gridDim.z == 1 && p.num_splits > 1
                          ? load_ids0(2 * (split_il * kCluster + rank) + kh)
                          : -1;
#else
  int ids0 = -1;  // warp 0, lanes 0-7: page ids of this CTA's first group
  if (warp == 0 && p.window == 0 && lane < kGroupPages) {
    const int pi = me * kGroupPages + lane;
    if (pi < (p.max_model_len + kPageSize - 1) / kPageSize) ids0 = bt[pi];  // in the table, maybe past L
  }
#endif
  const int L = p.seq_lens[req];
  PROBE(2);
  TRACE_DEP(2, L);  // (L arrived)
  const bool broken = L < kVerifyLen || L > p.max_model_len;
  // Keys some row sees: [lo, L - 1]; row 0 (position L - 8) starts lowest.
  const int lo = window > 0 ? max(0, L - (kVerifyLen - 1) - window) : 0;
  const int first_page = lo / kPageSize;
  const int last_page = (L - 1) / kPageSize;
  // Per-thread softmax state of rows lane/4 (head 2w) and lane/4 + 8 (head 2w + 1),
  // both token i = lane / 4.
  float o[8][4];
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  bool bad = false;
  int active;
  [[maybe_unused]] bool early_push = false;  // (see below; the mma.sync path never)
#if MUSE_ATTN2_WGMMA_PATH
  // Tiles of 4 pages go round-robin over the warpgroups of the active slices:
  // warpgroup vme takes tiles vme, vme + wgs, ... (tile t: pages first_page + 4t ..).
  const int num_tiles = broken ? 0 : (last_page - first_page + kTilePages) / kTilePages;
  // Slices in use for this L: one more per kSlicePages pages per CTA of a
  // cluster. Depends on L only: every cluster agrees, the merge order stays fixed.
  constexpr int kSliceTiles = kSlicePages / kTilePages * kCluster;
  active = kOneSlice ? 1 : max(1, min(p.num_splits, (num_tiles + kSliceTiles - 1) / kSliceTiles));
  bool interleaved = false;
  // Clusters are placed in launch order (x, then y): with one request and
  // every slice in use, at least 4 tiles per warpgroup on average, cluster c
  // (in that order) takes slice c / KVH of KV head c % KVH instead of slice x
  // of head y, so that every head's first slices (which carry the most tiles)
  // are placed first, not the last head's after all of the others'. TP8 128k:
  // 24.6-24.8 -> 23.9-24.0 us; applied at 32k it was 0.05 us slower, at 8k (4
  // of 7 slices in use) 0.2-0.3. The grid's last clusters are then the last
  // slice of the last two heads; the order is fixed by L, so the merge order
  // (and the bits) are too.
  if (!kOneSlice && gridDim.z == 1 && p.num_splits > 1 && active == p.num_splits &&
      num_tiles >= 8 * p.num_splits * kCluster) {
    interleaved = true;
    const int c = static_cast<int>(blockIdx.y) * p.num_splits + split;
    split = c / p.num_kv_heads;
    kvh = c % p.num_kv_heads;
    head = kvh * kHeadsPerKvHead + row / kVerifyLen;
    vme = 2 * (split * kCluster + rank) + kh;
    ids0 = ids0_il;  // (split == split_il)
  }
  // The grid's last cluster (interleaved: its last two), placed late
  // (idle_last_cluster): its warpgroups take only the first late_rounds
  // rounds of the round-robin, kLateTiles fewer than the others' whole
  // rounds, and the tiles after those rounds go round-robin over the other
  // warpgroups (wn of them), from kLateMinRounds whole rounds on. Where that
  // leaves it nothing (only where kLateTiles >= kLateMinRounds, as in the A/B
  // builds `lt2,lm0`), its pair takes one slice fewer and the cluster leaves.
  int late_rounds = INT_MAX;  // no late cluster: every tile in round-robin over all warpgroups
  if (num_tiles / (2 * active * kCluster) >= kLateMinRounds && idle_last_cluster(p, active, kvh, req, interleaved)) {
    const int q = num_tiles / (2 * active * kCluster) - kLateTiles;
    if (q > 0)
      late_rounds = q;
    else
      active -= 1;
  }
  if (split >= active) {  // the whole cluster leaves: it shares nothing with the others
    TRACE(11);
    return;
  }
  const int wgs = 2 * active * kCluster;
  const int wn = late_rounds == INT_MAX ? wgs : wgs - 2 * kCluster;  // warpgroups past the late rounds
  // One slice with a few tiles more than warpgroups (a 2048-key window sees
  // 2055 keys: 33 tiles for 32 warpgroups): the first r warpgroups take two
  // tiles each, the oldest ones in pairs, both copied before the wait, and
  // the others one each, so that the newest tile (this step's keys, copied
  // only after the wait) is never a warpgroup's second.
  const bool tail = kOneSlice && kWindow && num_tiles == wgs + 1 &&
                    last_page - first_page + 1 - kTilePages * (num_tiles - 1) <= kTailPages;
  // The odd tile (`tail`: 1-2 pages) goes at the window's old end (above),
  // in pieces of 8 keys (`piece`), one to each of the
  // second warpgroups of the first CTAs, copied before the wait with their
  // own tiles (v33; v31 had them at its new end). has_piece: this
  // warpgroup's second tile is the odd one.
  // Tile g's pages: tile_page0 + 4 g .. (with a window's odd pages: tile 0 is the
  // extra pages, its slots below first_page empty, and the whole tiles 1 ..).
  constexpr bool kHeadTiles = kOneSlice && kWindow;  // (tile 0's slots may be empty)
  const int head_pages = tail ? last_page - first_page + 1 - kTilePages * (num_tiles - 1) : 0;
  const int tile_page0 = first_page + (tail ? head_pages - kTilePages : 0);
  const int head_skip = (lo - first_page * kPageSize) / 8;  // pieces wholly below the window (0 or 1)
  const int num_pieces = 2 * head_pages - head_skip;
  const int piece = (vme - 1) / 2;
  const bool has_piece = tail && vme % 2 == 1 && piece < num_pieces;  // its second tile is the head
  const int piece_at = (kTilePages - head_pages) * 2 + head_skip + piece;  // in 8-key rows of its stage
  // (`true &&` here and in `fixed` below: the form the compiler saw while
  // both were A/B switches; without it, it emits other code for these
  // kernels, the window layer's 0.06 us slower: bench/NOTES-attn2.md,
  // twentieth session.)
  const int r_two =
      !tail && true && active == 1 && num_tiles > wgs && num_tiles <= 2 * wgs ? num_tiles - wgs : 0;
  // This warpgroup's tile j (pair-relative index).
  auto tile_of = [&](int j) {
    if (tail) return j == 0 ? vme + 1 : 0;
    if (r_two > 0) return vme < r_two ? 2 * vme + j : vme + r_two;
    return j < late_rounds ? j * wgs + vme : late_rounds * wgs + (j - late_rounds) * wn + vme;
  };
  int my_tiles;
  if (tail) {
    my_tiles = has_piece ? 2 : 1;
  } else if (r_two > 0) {
    my_tiles = vme < r_two ? 2 : 1;
  } else if (late_rounds == INT_MAX) {
    my_tiles = num_tiles > vme ? (num_tiles - 1 - vme) / wgs + 1 : 0;
  } else if (vme >= wn) {
    my_tiles = late_rounds;  // (late_rounds * wgs <= num_tiles: every late round is whole)
  } else {
    const int rest = num_tiles - late_rounds * wgs;
    my_tiles = late_rounds + (rest > vme ? (rest - 1 - vme) / wn + 1 : 0);
  }
  // No warpgroup of the cluster takes more than kWgStages - 1 tiles (the
  // same for all of its CTAs: it depends on L and the grid only), so none
  // ever fills its last stage, where the receive area lies: every CTA may
  // push its rows as soon as its own key loop is done, not once the whole
  // cluster's are. The cluster barrier's arrival (which publishes the
  // receive mbarrier's initialisation) moves here, before the loop.
  static_assert(kRecvOffset >= (kWgStages - 1) * kWgStageBytes + 1024 && kRecvOffset + kRecvBytes <= kWgStages * kWgStageBytes,
                "the receive area lies in warpgroup 0's last stage only");
  early_push = late_rounds == INT_MAX && num_tiles <= (kWgStages - 1) * wgs;
  if (early_push) cluster_arrive_for_push();
  if (!kOneSlice && MUSE_ATTN2_EARLY_TRIGGER && early_push) allow_dependents();  // (the call after the loop then does nothing)
  TRACE(30);
  // Stages (1024-byte aligned for the swizzle): warpgroup kh owns stages
  // kWgStages kh .. kWgStages (kh + 1) - 1, each K (8 KB) then V (8 KB); the Q tile after them.
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t q_tile = base + 2 * kWgStages * kWgStageBytes;
  auto stage_addr = [&](int s) { return base + static_cast<uint32_t>(s) * kWgStageBytes; };

  // ---- copies (warp 0 of each warpgroup, lanes 0-3: one page each, K and V boxes) ----
  const uint64_t policy = evict_first_policy();
  constexpr int kBatchTiles = 32 / kTilePages;  // page ids of 8 tiles per warp load
  auto load_batch = [&](int b) {                // tiles b .. b + 7: lane -> tile b + lane / 4, page lane % 4
    const int t = b + lane / kTilePages;
    const int pi = tile_page0 + tile_of(t) * kTilePages + lane % kTilePages;
    return (t < my_tiles && pi <= last_page && (!kHeadTiles || pi >= first_page)) ? bt[pi] : -1;
  };
  int ids = -1, ids_next = -1;
  // Stage s expects the bytes of the tile's pages this warp's lanes copy (ok).
  auto arm_stage = [&](int s, bool ok) {
#ifdef MUSE_ATTN2_DIAG_NO_COPY  // timing only (wrong results): no key copied, every stage ready at once
    ok = false;
#endif
    const uint32_t ok_mask = __ballot_sync(0xFFFFFFFFu, ok);
    if (lane == 0) mbar_arrive_expect_tx(&full_bar[s], __popc(ok_mask) * kPageBytes);
    __syncwarp();
  };
  // This lane's page (K and V boxes of page id) into its slot of stage s.
  auto copy_page = [&](int s, int id) {
#ifdef MUSE_ATTN2_DIAG_NO_COPY
    return;
#endif
    const uint32_t dst = stage_addr(s) + lane * (kHalfBytes / kTilePages);
    tma_load_5d(dst, &kv_map, 0, 0, 0, kvh, id, &full_bar[s], policy);               // K of the page
    tma_load_5d(dst + kHalfBytes, &kv_map, 0, 1, 0, kvh, id, &full_bar[s], policy);  // V of the page
  };
  auto issue = [&](int j) {  // tile j (this warpgroup's j-th) into its stage j % kWgStages, which is free
    const int g = tile_of(j);
    const int s = kh * kWgStages + j % kWgStages;
    int id;
    if (j == 0) {
      id = ids0;
    } else {
      if ((j - 1) % kBatchTiles == 0) {
        ids = ids_next;
        ids_next = load_batch(j + kBatchTiles);
      }
      id = __shfl_sync(0xFFFFFFFFu, ids, ((j - 1) % kBatchTiles) * kTilePages + lane % kTilePages);
    }
    const bool want = lane < kTilePages && tile_page0 + g * kTilePages + lane <= last_page &&
                      (!kHeadTiles || tile_page0 + g * kTilePages + lane >= first_page);
    const bool ok = want && id >= 0 && id < p.num_pages;
    bad |= want && !ok;
    arm_stage(s, ok);
    if (ok) copy_page(s, id);
  };
  // PDL: up to here the kernel has read only the lengths and the block
  // table, and below it copies up to kEarlyTiles tiles of keys older than
  // this step's 8 (positions < L - 8), before griddepcontrol.wait. No kernel
  // of a step writes those (qkv_front writes q, gate and the step's 8 keys,
  // after its own wait); the kernels before may still run (qkv_front, and
  // attn2 itself where its loops are short, trigger before their wait).
  const int first_new_page = (L - kVerifyLen) / kPageSize;  // pages from here on hold this step's keys
  const int ring = min(kWgStages, my_tiles);
  int issued = 0;
  if (rw == 0) {
    // (Without a window ids0 already holds tile vme's ids, loaded before L:
    // this warpgroup's tile 0 unless r_two is set.)
    if ((window != 0 || r_two > 0) && lane < kTilePages && my_tiles > 0 &&
        tile_page0 + tile_of(0) * kTilePages + lane <= last_page)
      ids0 = bt[tile_page0 + tile_of(0) * kTilePages + lane];
    ids_next = load_batch(1);
    TRACE_DEP(31, ids0);  // (the first tile's ids arrived)
    const int early = r_two > 0 || has_piece ? 2 : kEarlyTiles;
#ifdef MUSE_ATTN2_DIAG_NEWEST_EARLY  // timing only: this step's tile copied before the wait too (the bench never writes it)
    while (issued < min(ring, early)) issue(issued++);
#else
    while (issued < min(ring, early) && tile_page0 + (tile_of(issued) + 1) * kTilePages - 1 < first_new_page)
      issue(issued++);
    // Tile 0 holds this step's keys (a warpgroup's only tile at short L): its
    // older pages now, the whole tile's bytes expected on its barrier, and
    // only the page(s) with the step's keys after the wait (issued -1 says so).
    if (issued == 0 && ring > 0 && early > 0 && tile_page0 + tile_of(0) * kTilePages < first_new_page) {
      const int pi = tile_page0 + tile_of(0) * kTilePages + lane;
      const bool want = lane < kTilePages && pi <= last_page;
      const bool ok = want && ids0 >= 0 && ids0 < p.num_pages;
      bad |= want && !ok;
      arm_stage(kh * kWgStages, ok);
      if (ok && pi < first_new_page) copy_page(kh * kWgStages, ids0);
      issued = -1;
    }
#endif
    TRACE(28);
  }
#ifdef MUSE_ATTN2_DIAG_Q_EARLY  // timing only: q and the gate read before the wait (the bench never writes them)
  load_q_and_gate();
  wait_for_producer();
  PROBE(3);
#else
  wait_for_producer();
  PROBE(3);
  load_q_and_gate();
#endif
  if (kOneSlice && MUSE_ATTN2_EARLY_TRIGGER == 1 && kTriggerAfterWait) allow_dependents();
  if (rw == 0) {
    if (issued < 0) {  // tile 0's pages with this step's keys
      const int pi = tile_page0 + tile_of(0) * kTilePages + lane;
      if (lane < kTilePages && pi <= last_page && pi >= first_new_page && ids0 >= 0 && ids0 < p.num_pages)
        copy_page(kh * kWgStages, ids0);
      issued = 1;
    }
    while (issued < ring) issue(issued++);
  }
  TRACE(29);

  // ---- Q tile, 128-byte swizzled: 16-byte chunk c of row r at r * 128 + (c ^ r % 8) * 16 ----
#pragma unroll
  for (int k = 0; k < kQLoads; ++k) {
    const int idx = (kh * kQLoads + k) * 32 + lane, r = rw * 16 + idx / 8, c = idx % 8;
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(q_tile + r * 128 + ((c ^ (r % 8)) * 16)),
                 "r"(qv[k].x), "r"(qv[k].y), "r"(qv[k].z), "r"(qv[k].w)
                 : "memory");
  }
  if (merger) s_gate[threadIdx.x] = gate_v;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the Q tile is read by wgmma (async proxy)
  __syncthreads();
  PROBE(4);

  {
    const int pos = L - kVerifyLen + lane / 4;  // this thread's rows' position
    const int col = (lane % 4) * 2;             // this thread's first column of each n-tile of 8
    const int wtid = threadIdx.x % 128;         // thread within the warpgroup
    // Tile it's stage once its copies have landed; V rows of keys past L zeroed.
    auto tile_ready = [&](int it, int& key0, bool& masked) {
      const int g = tile_of(it);
      const int s = kh * kWgStages + it % kWgStages;
      mbar_wait(&full_bar[s], (it / kWgStages) & 1);
#ifdef MUSE_ATTN2_TRACE
      if (it == 1) TRACE(22);  // when warpgroup 0's tile 1 and its last landed
      if (it >= 2) TRACE(23);  // (the last of tiles 2, 3, ...)
#endif
      key0 = (tile_page0 + g * kTilePages) * kPageSize;
      if (key0 + kTileKeys > L) {
        // Keys past L may hold anything (NaN; pages past the last are not
        // even loaded): P is 0 there, but 0 * NaN is not. Zero their V rows.
        const uint32_t v_tile = stage_addr(s) + kHalfBytes;
        for (int c = max(0, L - key0) * 8 + wtid; c < kTileKeys * 8; c += 128)
          asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(v_tile + c * 16), "r"(0) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (kh == 0)  // the warpgroup's 4 warps (named barriers 1 and 2)
          asm volatile("bar.sync 1, 128;" ::: "memory");
        else
          asm volatile("bar.sync 2, 128;" ::: "memory");
      }
      // Uniform per tile: only tiles holding keys past row 0's position or
      // below row 7's window need masks.
      masked = key0 + kTileKeys - 1 > L - kVerifyLen || (window > 0 && key0 < L - window);
      return s;
    };
    float s_acc[8][4];  // S of one tile (64 rows x 64 keys), then its P in fp32
    uint32_t pa[4][4];  // P as the A fragments of the 4 k-steps (16 keys each) of O += P V
    // S = Q K^T: 4 k-steps of 16 dims (32 bytes into the swizzled rows), asynchronous.
    auto issue_s = [&](auto& acc, int s) {
      wgmma_fence();
#ifdef MUSE_ATTN2_DIAG_NO_S  // timing only (wrong results): no S = Q K^T, every score 0
#pragma unroll
      for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#else
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_ss(acc, sw128_desc(q_tile + ks * 32, 16, 1024), sw128_desc(stage_addr(s) + ks * 32, 16, 1024), ks);
#endif
      wgmma_commit();
    };
    // O += P V: k-step kk covers keys 16kk .. 16kk + 15 (2048 bytes of V rows),
    // asynchronous.
    auto issue_pv = [&](int s) {
      wgmma_fence();
#ifndef MUSE_ATTN2_DIAG_NO_PV  // (timing only, wrong results: no O += P V)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs(o, pa[kk], sw128_desc(stage_addr(s) + kHalfBytes + kk * 2048, kHalfBytes, 1024));
#endif
      wgmma_commit();
    };
    // The tile's masks (keys past a row's position or below its window), then
    // online_softmax; alpha is applied to O once the previous P V is done.
    auto mask_if = [&](auto& acc, int key0, bool masked) {  // a whole tile's scores, where tile_ready says so
      if (masked) mask_tile(acc, [&](int t, int e) { return key0 + t * 8 + col + (e & 1); }, pos, window);
    };
    auto softmax = [&](auto& acc, int key0, bool masked, float (&alpha)[2]) {
      mask_if(acc, key0, masked);
      online_softmax(acc, m_run, l_run, alpha);
    };
    // P of a tile's 64 keys (acc's first 8 n-tiles) as the A fragments of P V.
    auto pack = [&](auto& acc) {
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        pa[t / 2][(t % 2) * 2] = pack_bf16(acc[t][0], acc[t][1]);
        pa[t / 2][(t % 2) * 2 + 1] = pack_bf16(acc[t][2], acc[t][3]);
      }
    };
    auto rescale_and_pack = [&](auto& acc, const float (&alpha)[2]) {
      rescale(o, alpha);
      pack(acc);
    };
    // Software pipeline (FA3's intra-warpgroup overlap): while the tensor
    // cores run tile it's P V, this warpgroup's S of tile it + 1 is already
    // computed and its softmax runs beside them.
    if (my_tiles > 0) {
      int key0;
      bool masked;
      float alpha[2];
      int s = tile_ready(0, key0, masked);
      PROBE(5);
#ifndef MUSE_ATTN2_DIAG_NO_MATH
      issue_s(s_acc, s);
#endif
      auto release = [&](int it, int st) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty_bar[st]);
        if (rw == 0 && it + kWgStages < my_tiles) {
          mbar_wait(&empty_bar[st], (it / kWgStages) & 1);  // the warpgroup is done with this stage
          issue(it + kWgStages);
        }
      };
#ifdef MUSE_ATTN2_DIAG_NO_MATH  // timing only (wrong results): every tile waited for and released, no S, softmax or P V
      if (has_piece) {
        tile_ready(1, key0, masked);
        release(0, s);
      } else {
        for (int it = 0; it < my_tiles; ++it) {
          if (it > 0) s = tile_ready(it, key0, masked);
          release(it, s);
        }
      }
      if (false)
#endif
      if (has_piece) {  // (warpgroup-uniform) one pass over the tile and its piece: 64 + 8 keys
        int key0b;
        bool maskedb;
        const int sb = tile_ready(1, key0b, maskedb);
        float t_acc[1][4];
        // S of the piece: keys 8 * piece_at.. of its stage, one 1024-byte swizzle atom.
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_ss(t_acc, sw128_desc(q_tile + ks * 32, 16, 1024),
                   sw128_desc(stage_addr(sb) + piece_at * 1024 + ks * 32, 16, 1024), ks);
        wgmma_commit();
        wgmma_wait<0>();
        pin(s_acc);
        pin(t_acc);
        // Masks where they apply: the piece always, the tile if tile_ready says so.
        const int keyp = key0b + piece_at * 8;
        mask_if(s_acc, key0, masked);
        mask_tile(t_acc, [&](int, int e) { return keyp + col + (e & 1); }, pos, window);
        float w[9][4];  // the 72 keys' scores, then their P
#pragma unroll
        for (int t = 0; t < 9; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) w[t][e] = t < 8 ? s_acc[t][e] : t_acc[0][e];
        // (The first tile of the warpgroup: O is 0, alpha 0, no rescale.)
        online_softmax(w, m_run, l_run, alpha);
        // The piece's k-step: its page's 16 keys, the other 8 at P = 0.
        uint32_t pb[1][4];
        const uint32_t pr0 = pack_bf16(w[8][0], w[8][1]), pr1 = pack_bf16(w[8][2], w[8][3]);
        const bool hi = piece_at % 2;
        pb[0][0] = hi ? 0u : pr0;
        pb[0][1] = hi ? 0u : pr1;
        pb[0][2] = hi ? pr0 : 0u;
        pb[0][3] = hi ? pr1 : 0u;
        pack(w);
        TRACE(25);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_rs(o, pa[kk], sw128_desc(stage_addr(s) + kHalfBytes + kk * 2048, kHalfBytes, 1024));
        wgmma_rs(o, pb[0], sw128_desc(stage_addr(sb) + kHalfBytes + piece_at / 2 * 2048, kHalfBytes, 1024));
        wgmma_commit();
        wgmma_wait<0>();
        pin(o);
        pin_a(pa);
        pin_a(pb);
        release(0, s);
      } else {
        wgmma_wait<0>();
        pin(s_acc);
        TRACE(24);
        softmax(s_acc, key0, masked, alpha);
        rescale_and_pack(s_acc, alpha);
        TRACE(25);
        for (int it = 0; it + 1 < my_tiles; ++it) {
          const int s_next = tile_ready(it + 1, key0, masked);
          issue_s(s_acc, s_next);
          issue_pv(s);
          wgmma_wait<1>();  // S of tile it + 1 (committed first); P V of tile it may still run
          pin(s_acc);
          bool usual = true;  // this tile takes online_softmax and O its alpha
          if (kLaterMax) {
            mask_if(s_acc, key0, masked);
            usual = later_softmax(s_acc, m_run, l_run);
          } else {
            softmax(s_acc, key0, masked, alpha);
          }
          wgmma_wait<0>();
          pin(o);
          pin_a(pa);  // the P V just done read pa asynchronously: its registers were live until here
          release(it, s);
          if (kLaterMax && usual) {  // (warp-uniform, rare) the scores again, with pa's registers free
            scores_again(s_acc, q_tile, stage_addr(s_next), rw, lane);
            mask_if(s_acc, key0, masked);
            online_softmax(s_acc, m_run, l_run, alpha);
          }
          if (usual) rescale(o, alpha);
          pack(s_acc);
          s = s_next;
        }
        issue_pv(s);
        wgmma_wait<0>();
        pin(o);
        pin_a(pa);
        release(my_tiles - 1, s);
      }
      TRACE(26);
    }
    // Row sums: the 4 lanes of a row hold disjoint columns (fixed butterfly order).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xFFFFFFFFu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xFFFFFFFFu, l_run[r], 2);
    }
  }
#else
  const int num_groups = broken ? 0 : (last_page - first_page + kGroupPages) / kGroupPages;
  // Slices in use for this L: one more per 2 groups per CTA of a cluster
  // (L = 2048 -> 16 groups -> one slice, merged in the cluster, no workspace
  // round trip; from L = 32k on all 15 of TP8). Depends on L only: every
  // cluster agrees, and the merge order stays fixed.
  active = kOneSlice ? 1 : max(1, min(p.num_splits, (num_groups + 2 * kCluster - 1) / (2 * kCluster)));
  if (idle_last_cluster(p, active, kvh, req)) active -= 1;
  if (split >= active) return;  // the whole cluster leaves: it shares nothing with the others
  const int ctas = active * kCluster;
  const int my_groups = num_groups > me ? (num_groups - 1 - me) / ctas + 1 : 0;
  const uint32_t smem_base = smem_addr(smem);
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kSmemBytes);  // row = head * 8 + token


  // ---- copies (warp 0, lanes 0-7: one page each) -----------------------------------
  // A 5th, producer-only warp would cost the second CTA per SM: two CTAs of 5
  // warps put 3-4 warps on one SM sub-partition, whose 16K registers then hold
  // 128 per thread at most. So warp 0 issues group j + 3 into the stage that
  // all 4 warps have just released.
  const uint64_t policy = evict_first_policy();
  const char* kv = static_cast<const char*>(p.kv_cache) + static_cast<int64_t>(kvh) * kPageBytes;
  const int64_t page_pitch = static_cast<int64_t>(p.num_kv_heads) * kPageBytes;
  // Page ids one batch ahead: group 0 (lanes 0-7), then batches of 4 groups
  // (lane -> group b + lane / 8, slot lane % 8) loaded while the previous batch is used.
  auto load_batch = [&](int b) {
    const int it2 = b + lane / 8;
    const int pi = first_page + (me + it2 * ctas) * kGroupPages + lane % 8;
    return (it2 < my_groups && pi <= last_page) ? bt[pi] : -1;
  };
  int ids = -1, ids_next = -1;
  auto issue = [&](int j) {  // group j (this CTA's j-th) into stage j % kStages, which is free
    const int g = me + j * ctas;
    const int st = j % kStages;
    int id;
    if (j == 0) {
      id = ids0;
    } else {
      if (((j - 1) & 3) == 0) {
        ids = ids_next;
        ids_next = load_batch(j + 4);
      }
      id = __shfl_sync(0xFFFFFFFFu, ids, ((j - 1) & 3) * 8 + (lane & 7));
    }
    const bool want = lane < kGroupPages && first_page + g * kGroupPages + lane <= last_page;
    const bool ok = want && id >= 0 && id < p.num_pages;
    bad |= want && !ok;
    const uint32_t ok_mask = __ballot_sync(0xFFFFFFFFu, ok);
    if (lane == 0) mbar_arrive_expect_tx(&full_bar[st], __popc(ok_mask) * kPageBytes);
    __syncwarp();
    if (ok)
      bulk_copy(smem_base + st * kStageBytes + lane * kSlotBytes, kv + id * page_pitch, kPageBytes, &full_bar[st],
                policy);
  };
  if (warp == 0) {
    if (p.window != 0 && lane < kGroupPages && my_groups > 0 && first_page + me * kGroupPages + lane <= last_page)
      ids0 = bt[first_page + me * kGroupPages + lane];
    ids_next = load_batch(1);
    for (int j = 0; j < min(kStages, my_groups); ++j) issue(j);
  }

  {
    // ---- all warps: row block rw (heads 2rw, 2rw + 1), key half kh -------------------
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int idx = (kh * kQLoads + k) * 32 + lane, r = idx / 8, c = idx % 8;
      *reinterpret_cast<uint4*>(&s_q[(rw * 16 + r) * kQStride + c * 8]) = qv[k];
    }
    if (merger) s_gate[threadIdx.x] = gate_v;
    if (kKeySplit == 1)
      __syncwarp();
    else
      __syncthreads();  // a row block's Q tile comes from two warps
    // This lane's ldmatrix row of the m16k16 Q fragments: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15).
    const uint32_t q_addr = smem_addr(s_q) + (rw * 16 + lane % 8 + ((lane / 8) % 2) * 8) * (kQStride * 2) + (lane / 16) * 16;
    const int pos = L - kVerifyLen + lane / 4;  // this thread's rows' position
    const int slot_lo = (lane % 4) * 2;         // page slots of this thread's S columns: slot_lo, slot_lo + 1
    for (int it = 0; it < my_groups; ++it) {
      const int g = me + it * ctas;
      const int st = it % kStages;
      mbar_wait(&full_bar[st], (it / kStages) & 1);
      // ldmatrix row address of this lane: page slot lane % 8 of the stage.
      const uint32_t slot = smem_base + st * kStageBytes + (lane % 8) * kSlotBytes;
      const int key0 = (first_page + g * kGroupPages) * kPageSize;
      // Uniform per group: only groups holding keys past row 0's position or
      // below row 7's window need masks (and, past L, zeroed V).
      const bool masked = key0 + kGroupKeys - 1 > L - kVerifyLen || (p.window > 0 && key0 < L - p.window);

      // S = Q K^T: n-tile t is key kh*kKeyTiles + t of the 8 pages; column n = page slot.
      // k-step outer: one Q fragment (4 registers) live at a time.
      float s[kKeyTiles][4];
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t qf[4];
        ldmatrix_x4(qf, q_addr + ks * 32);
        // Matrices: (key 2tp, dims 16ks..), (key 2tp, dims 16ks + 8..), then key 2tp + 1.
        const uint32_t krow = slot + (lane / 16) * kKeyBytes + (2 * ks + (lane / 8) % 2) * 16;
#pragma unroll
        for (int tp = 0; tp < kKeyTiles / 2; ++tp) {
          uint32_t b[4];
          ldmatrix_x4(b, krow + (kh * kKeyTiles + 2 * tp) * kKeyBytes);
          mma_bf16(s[2 * tp], qf, b[0], b[1]);
          mma_bf16(s[2 * tp + 1], qf, b[2], b[3]);
        }
      }
      if (masked)
        mask_tile(s, [&](int t, int e) { return key0 + (slot_lo + (e & 1)) * kPageSize + kh * kKeyTiles + t; }, pos,
                  p.window);
      float alpha[2];
      online_softmax(s, m_run, l_run, alpha);
      rescale(o, alpha);
      // O += P V: k-step kk covers keys 2kk (k 0..7 = slots) and 2kk + 1 (k 8..15).
#pragma unroll
      for (int lk = 0; lk < kKeyTiles / 2; ++lk) {
        const int kk = kh * (kKeyTiles / 2) + lk;
        const uint32_t a[4] = {pack_bf16(s[2 * lk][0], s[2 * lk][1]), pack_bf16(s[2 * lk][2], s[2 * lk][3]),
                               pack_bf16(s[2 * lk + 1][0], s[2 * lk + 1][1]),
                               pack_bf16(s[2 * lk + 1][2], s[2 * lk + 1][3])};
        // Matrices: (key 2kk, dims 8c..), (key 2kk + 1, dims 8c..), then dims 8c + 8.
        const uint32_t vrow = slot + (2 * kk + (lane / 8) % 2) * kKeyBytes + kHeadDim * 2 + (lane / 16) * 16;
#pragma unroll
        for (int cp = 0; cp < 4; ++cp) {
          uint32_t v[4];
          ldmatrix_x4_trans(v, vrow + cp * 32);
          if (masked) {
            // Keys past L may hold anything (NaN): P is 0 there, but 0 * NaN is not.
            // This lane holds slots slot_lo (low half) and slot_lo + 1 (high half).
            const int j_lo = key0 + slot_lo * kPageSize + 2 * kk;
            const uint32_t keep0 = (j_lo < L ? 0x0000FFFFu : 0u) | (j_lo + kPageSize < L ? 0xFFFF0000u : 0u);
            const uint32_t keep1 =
                (j_lo + 1 < L ? 0x0000FFFFu : 0u) | (j_lo + 1 + kPageSize < L ? 0xFFFF0000u : 0u);
            v[0] &= keep0;
            v[2] &= keep0;
            v[1] &= keep1;
            v[3] &= keep1;
          }
          mma_bf16(o[2 * cp], a, v[0], v[1]);
          mma_bf16(o[2 * cp + 1], a, v[2], v[3]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty_bar[st]);
      if (warp == 0 && it + kStages < my_groups) {
        mbar_wait(&empty_bar[st], (it / kStages) & 1);  // every warp is done with this stage
        issue(it + kStages);
      }
    }
    // Row sums: the 4 lanes of a row hold disjoint columns (fixed butterfly order).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xFFFFFFFFu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xFFFFFFFFu, l_run[r], 2);
    }
  }
#endif
  if (bad) s_bad = 1;
  float* merge_o = reinterpret_cast<float*>(smem);
  // Key-half exchange after the merge area: 9 float4 per thread of the second
  // half (O, then m and l), thread-minor so that both sides are conflict-free.
  float4* xchg = reinterpret_cast<float4*>(smem + kRows * kMergeStride * 4);
  constexpr int kHalfThreads = kRowWarps * 32;
  if (kKeySplit == 2) __syncthreads();  // the first half may still read the last stage
  // Every stage consumed (wgmma and TMA done with it): the receive area may be
  // written.
  if (!early_push) cluster_arrive_for_push();
  TRACE(27);
  if (kKeySplit == 2 && kh == 1) {
    const int t = threadIdx.x - kHalfThreads;
#pragma unroll
    for (int n = 0; n < 8; ++n) xchg[n * kHalfThreads + t] = make_float4(o[n][0], o[n][1], o[n][2], o[n][3]);
    xchg[8 * kHalfThreads + t] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
  }
  __syncthreads();  // every stage consumed, s_bad set, the second half's state written
  PROBE(6);
  allow_dependents();
  if (kKeySplit == 2 && kh == 0) {
    // Both halves' states, merged in a fixed order (first half, then second).
    // The second half's warps only join the cluster barriers from here on:
    // the merger threads are all in the first half.
    const float4 ml = xchg[8 * kHalfThreads + threadIdx.x];
    const float m1[2] = {ml.x, ml.y}, l1[2] = {ml.z, ml.w};
    float a0[2], a1[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m_run[r], m1[r]);
      const float mu = m_new == -INFINITY ? 0.0f : m_new;
      a0[r] = fast_exp2((m_run[r] - mu) * kScaleLog2);
      a1[r] = fast_exp2((m1[r] - mu) * kScaleLog2);
      m_run[r] = m_new;
      l_run[r] = a0[r] * l_run[r] + a1[r] * l1[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float4 v = xchg[n * kHalfThreads + threadIdx.x];
      o[n][0] = a0[0] * o[n][0] + a1[0] * v.x;
      o[n][1] = a0[0] * o[n][1] + a1[0] * v.y;
      o[n][2] = a0[1] * o[n][2] + a1[1] * v.z;
      o[n][3] = a0[1] * o[n][3] + a1[1] * v.w;
    }
  }

  // ---- this CTA's state to shared memory (over the stages), or (kRegPush) to registers ----
  [[maybe_unused]] uint32_t ho[2][8];  // (kRegPush) rows r: fp16 pairs of O * 2^-e, n-tile n
  [[maybe_unused]] float4 mls[2];      // (kRegPush) rows r: m (log2 domain), l, 2^e
  if (kh == 0) {
    const bool nan_rows = broken || s_bad != 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + r * 8 + lane / 4;  // = head * 8 + token
      // The row's largest |O| (its 4 lanes), its exponent e clamped to the
      // normal range: O * 2^-e in fp16, 2^e beside m and l.
      float mx = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(fabsf(o[n][2 * r]), fabsf(o[n][2 * r + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      const int e = mx > 0.0f ? min(127, max(-126, static_cast<int>((__float_as_uint(mx) >> 23) & 0xFF) - 127)) : 0;
      const float down = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
      const float up = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
      if constexpr (kRegPush) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const __half2 h = __floats2half2_rn(o[n][2 * r] * down, o[n][2 * r + 1] * down);
          ho[r][n] = *reinterpret_cast<const uint32_t*>(&h);
        }
        mls[r] = make_float4(m_run[r] * kScaleLog2, nan_rows ? NAN : l_run[r], up, 0.0f);
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<__half2*>(reinterpret_cast<__half*>(merge_o) + row * kMergeStrideH + n * 8 +
                                      (lane % 4) * 2) = __floats2half2_rn(o[n][2 * r] * down, o[n][2 * r + 1] * down);
        if (lane % 4 == 0)  // the merges work in the log2 domain
          s_mls[row] = make_float4(m_run[r] * kScaleLog2, nan_rows ? NAN : l_run[r], up, 0.0f);
      }
    }
  }
  TRACE(19);

  if (!kRegPush) __syncthreads();  // this CTA's rows (fp16 O, m, l, 2^e) all in shared memory
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every CTA past its key loop
  PROBE(7);
  if constexpr (kRegPush) {
    // Row r to rank r / kMergeRows, slot (source rank, r % kMergeRows): the 2 x
    // 16 bytes of lane quad q (halves h = 0, 1), then (q = 0) m, l, 2^e.
    if (kh == 0) {
      const uint32_t recv = smem_addr(smem + kRecvOffset), bar = smem_addr(&recv_bar);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rw * 16 + r * 8 + lane / 4;
        const int to = row / kMergeRows, slot = rank * kMergeRows + row % kMergeRows;
        // Half h at h kRecvHalfBytes + 64 slot + 16q: a warp's 8 rows go out
        // as two runs of 256 contiguous bytes.
        const uint32_t at = recv + slot * 64 + (lane % 4) * 16;
        push_v4(at, make_uint4(ho[r][0], ho[r][1], ho[r][2], ho[r][3]), bar, to);
        push_v4(at + kRecvHalfBytes, make_uint4(ho[r][4], ho[r][5], ho[r][6], ho[r][7]), bar, to);
        if (lane % 4 == 0)
          push_v4(recv + kRows * kHeadDim * 2 + slot * 16,
                  make_uint4(__float_as_uint(mls[r].x), __float_as_uint(mls[r].y), __float_as_uint(mls[r].z),
                             __float_as_uint(mls[r].w)),
                  bar, to);
      }
    }
  } else {
    // Row r to rank r / kMergeRows, at (source rank, r % kMergeRows): 8 chunks
    // of 16 bytes of O per row, then one of m, l, 2^e.
    const uint32_t recv = smem_addr(smem + kRecvOffset), bar = smem_addr(&recv_bar);
    const __half* own_o = reinterpret_cast<const __half*>(merge_o);
    static_assert(kRows * 8 % kThreads == 0, "whole rounds of chunks");
#pragma unroll  // (as a loop: 0.03-0.1 us slower, v27)
    for (int i = 0; i < kRows * 8 / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int r = c / 8, q = c % 8;
      const uint4 v = *reinterpret_cast<const uint4*>(own_o + r * kMergeStrideH + q * 8);
      push_v4(recv + ((rank * kMergeRows + r % kMergeRows) * kHeadDim + q * 8) * 2, v, bar, r / kMergeRows);
    }
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      const float4 v = s_mls[r];
      push_v4(recv + kRows * kHeadDim * 2 + (rank * kMergeRows + r % kMergeRows) * 16,
              make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)), bar,
              r / kMergeRows);
    }
  }

  // ---- cluster merge: rank r owns rows [r * 64 / C, ...), kRowThreads threads per row ----
  float sg[kCols];  // the merger threads' gate, sigmoid applied
  // (Where loops are short, while the merges are in flight; after them at long
  // L, where computing it here made TP8 128k 0.6 us slower, 32k 0.15.)
  const bool gate_early = kOneSlice || early_push;
  if (gate_early && merger) gate_sigmoid(s_gate[threadIdx.x], sg);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  float m_all = -INFINITY, l_all = 0.0f;
  if (merger) {
    // Every rank's piece of this row from the receive area, once all landed;
    // then the weighted sums in rank order.
    mbar_wait(&recv_bar, 0);
    const int rr = threadIdx.x / kRowThreads;  // row % kMergeRows
    const __half* rcv_o = reinterpret_cast<const __half*>(smem + kRecvOffset);
    const float4* rcv_mls = reinterpret_cast<const float4*>(smem + kRecvOffset + kRows * kHeadDim * 2);
    float ok[kCluster][kCols];
#pragma unroll
    for (int k = 0; k < kCluster; ++k) {
      // (kRegPush: position d lies in half d / 32, at d % 32 of slot (k, rr):
      // (h C + k) 64 / C + rr = h kRows + slot runs of 32 halves, h kRecvHalfBytes bytes apart)
      static_assert(kRecvHalfBytes == kCluster * kMergeRows * 32 * 2, "the push's half stride");
      const __half* at = kRegPush ? rcv_o + ((d / 32 * kCluster + k) * kMergeRows + rr) * 32 + d % 32
                                  : rcv_o + (k * kMergeRows + rr) * kHeadDim + d;
      if constexpr (kCols == 4) {
        const uint2 h = *reinterpret_cast<const uint2*>(at);
        const float4 v = half4_to_float4(h.x, h.y);
        ok[k][0] = v.x, ok[k][1] = v.y, ok[k][2] = v.z, ok[k][3] = v.w;
      } else {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(at));
        ok[k][0] = v.x, ok[k][1] = v.y;
      }
    }
    combine_ranks_local<kCluster>(ok, rcv_mls + rr, kMergeRows, m_all, l_all, acc);
  }
  TRACE(15);
  __nv_bfloat16* out_ptr = static_cast<__nv_bfloat16*>(p.out) + grow * p.out_stride + head * kHeadDim + dc;

  if (active == 1) {
    PROBE(8);
    if (merger) {
      if (!gate_early) gate_sigmoid(s_gate[threadIdx.x], sg);
      finish_row<kRowThreads>(acc, l_all, sg, out_ptr);
      PROBE(9);
    }
    TRACE(11);
    return;
  }

  // ---- split path: each slice's partial rows go to the workspace; per CTA
  // rank, one slice merges that rank's rows over all slices, in slice order
  // (the order, hence the bits, is fixed) -------------------------------------------
  float2* ws_ml = reinterpret_cast<float2*>(static_cast<char*>(p.workspace) +
                                            detail::attn2_counter_bytes(static_cast<int64_t>(p.num_reqs) * p.num_kv_heads));
  float* ws_o = reinterpret_cast<float*>(ws_ml + static_cast<int64_t>(p.num_reqs) * p.num_kv_heads * p.num_splits * kRows);
  const int pair = req * p.num_kv_heads + kvh;
  int* counter = static_cast<int*>(p.workspace) + pair * detail::kAttn2MaxCluster + rank;  // per (pair, rank)
  const int64_t slice0 = static_cast<int64_t>(pair) * p.num_splits * kRows;  // (pair, slice 0, row 0)
  // Every slice publishes its partial rows (st_ws: each word marks itself
  // written), then thread 0 takes a ticket with a relaxed add, unordered with
  // the stores: no wait for them to land. The CTA with the last ticket merges
  // its rank's rows, reading the others' words again until all are written.
  // It only ever waits for CTAs that took their ticket before it: those have
  // issued their stores and wait for nothing else (no deadlock, whatever the
  // grid's waves).
  // Where the whole grid is co-resident (host: p.resident), one fixed slice
  // merges without a ticket: it polls the others' words until they are written, one
  // L2 round trip sooner than the ticket's answer. It waits only for CTAs
  // that wait for nothing (every other slice stores and leaves), and all of
  // them fit on the GPU beside it, so it cannot wait forever.
  const bool fixed = true && p.resident;  // (`true &&`: see r_two)
  const int merge_split = active - 1;
  if (merger && !(fixed && split == merge_split)) {  // (the merger's own rows are not read back: they stay in registers)
    const int64_t at = slice0 + static_cast<int64_t>(split) * kRows + row;
    if (d == 0) st_ws(&ws_ml[at], make_float2(m_all, l_all));
    st_ws_cols(&ws_o[at * kHeadDim + d], acc);
  }
  TRACE(16);
#ifdef MUSE_ATTN2_TRACE
  if (threadIdx.x == 0)  // word 8: which slice, head and rank this CTA was (bits 8-15, 16-23, 24-31)
    g_ring[trace_slot][8] = (static_cast<unsigned long long>(split) << 8) | (static_cast<unsigned>(kvh) << 16) |
                            (static_cast<unsigned long long>(rank) << 24) | (1ull << 32);  // (bit 32: set)
#endif
  // Whether this CTA merges: with the fixed merger every thread knows it (no
  // barrier: the other slices' words are polled, not this CTA's); with
  // tickets thread 0's answer reaches the others through the barrier's OR.
  bool last = split == merge_split;
  if (!fixed) {
    bool got_last = false;
    if (threadIdx.x == 0) {
      int ticket;
      asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;" : "=r"(ticket) : "l"(counter) : "memory");
      got_last = ticket == active - 1;
      if (got_last) *counter = 0;  // every ticket is taken: ready for the next launch (after its griddepcontrol.wait)
      TRACE(17);
    }
    last = __syncthreads_or(got_last) != 0;
  }
#ifdef MUSE_ATTN2_DIAG_MERGER_RANKS  // timing only (their rows unwritten): the merging slice's ranks from N on leave
  if (rank >= MUSE_ATTN2_DIAG_MERGER_RANKS) last = false;
#endif
  if (!last || !merger) {
    TRACE(11);
    return;
  }
  // The merger: 8 slices per round (all loads in flight at once; 16 would
  // spill), read again until every word of the round is written, then cleared
  // and merged in slice order.
  constexpr int kRound = MUSE_ATTN2_WGMMA_PATH ? 8 : 4;  // the mma.sync path holds more registers
  float m_max = -INFINITY, l_sum = 0.0f, f[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) f[c] = 0.0f;
  for (int z0 = 0; z0 < active; z0 += kRound) {
    uint2 ml[kRound];
    uint32_t ov[kRound][kCols];
    for (;;) {
      bool written = true;
#pragma unroll
      for (int k = 0; k < kRound; ++k) {
        const int z = z0 + k;
        if (z < active && z != split) {
          const int64_t at = slice0 + static_cast<int64_t>(z) * kRows + row;
          ml[k] = ld_ws(&ws_ml[at]);
          ld_ws_cols(&ws_o[at * kHeadDim + d], ov[k]);
          written = written && ml[k].x != 0u && ml[k].y != 0u;
#pragma unroll
          for (int c = 0; c < kCols; ++c) written = written && ov[k][c] != 0u;
        }
      }
      const bool all_written = __all_sync(0xFFFFFFFFu, written);  // the merger warps are whole (rows of 16 or 32 lanes)
#ifdef MUSE_ATTN2_TRACE
      unsigned missing = 0;  // slots some lane of the first warp found unwritten (word 8, bits 0-7)
#pragma unroll
      for (int k = 0; k < kRound; ++k) {
        const int z = z0 + k;
        bool wk = true;
        if (z < active && z != split) {
          wk = ml[k].x != 0u && ml[k].y != 0u;
#pragma unroll
          for (int c = 0; c < kCols; ++c) wk = wk && ov[k][c] != 0u;
        }
        missing |= __all_sync(0xFFFFFFFFu, wk) ? 0u : 1u << k;
      }
      if (threadIdx.x == 0) {  // polls of the merger's first warp, and when the first one returned
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(static_cast<int>(all_written)));
        if (g_ring[trace_slot][20]++ == 0) {
          g_ring[trace_slot][21] = t;
          g_ring[trace_slot][8] |= missing;
        }
      }
#endif
      if (all_written) break;
    }
    // The round's slots back to "not written" for the next launch, now, so
    // that these stores drain while the merge and the output run.
#pragma unroll
    for (int k = 0; k < kRound; ++k) {
      const int z = z0 + k;
      if (z < active) {
        const int64_t at = slice0 + static_cast<int64_t>(z) * kRows + row;
        if (d == 0) clear_ws(&ws_ml[at]);
        clear_ws_cols<kCols>(&ws_o[at * kHeadDim + d]);
      }
    }
    // The round's largest m first (exact whatever the order), then every
    // slice's weight at once; the sums stay in slice order.
    float mk[kRound], lk[kRound], ok[kRound][kCols];
    float m_round = m_max;
#pragma unroll
    for (int k = 0; k < kRound; ++k) {
      const int z = z0 + k;
      const bool own = z == split;
      mk[k] = own ? m_all : ws_value(ml[k].x);
      lk[k] = own ? l_all : ws_value(ml[k].y);
#pragma unroll
      for (int c = 0; c < kCols; ++c) ok[k][c] = own ? acc[c] : ws_value(ov[k][c]);
      if (z < active) m_round = fmaxf(m_round, mk[k]);
    }
    const float mu = m_round == -INFINITY ? 0.0f : m_round;  // nothing visible yet: every weight 0
    const float sc = fast_exp2(m_max - mu);
    m_max = m_round;
    l_sum *= sc;
#pragma unroll
    for (int c = 0; c < kCols; ++c) f[c] *= sc;
#pragma unroll
    for (int k = 0; k < kRound; ++k) {
      if (z0 + k < active) {
        const float w = fast_exp2(mk[k] - mu);
        l_sum = fmaf(w, lk[k], l_sum);
#pragma unroll
        for (int c = 0; c < kCols; ++c) f[c] = fmaf(w, ok[k][c], f[c]);
      }
    }
  }
  TRACE(18);
  if (!gate_early) gate_sigmoid(s_gate[threadIdx.x], sg);
  finish_row<kRowThreads>(f, l_sum, sg, out_ptr);
  PROBE(9);
  TRACE(11);
}

// ---------------------------------------------------------------------------
// Host side: the cache's tensor map and the launches.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() { return detail::encode_tiled_fn(); }

// The cache [pages, KVH, 16, 128] as 5-D (64 elements, K|V, key, KV head,
// page), read in boxes of one page's K or V of one KV head (16 x 64, 2 KB),
// 128-byte swizzled. The map depends only on (address, pages, KV heads): a
// layer's cache hits a small per-thread table after its first call (encoding
// costs host time, and SPEC section 7 gives an op 5 us in all).
bool kv_map(CUtensorMap* map, const Attn2Params& p) {
  const detail::TensorMapKey key{p.kv_cache, {p.num_pages, p.num_kv_heads}};
  return detail::cached_tensor_map<6>(map, key, [&](CUtensorMap* m) {
    const auto encode = encode_tiled();
    if (!encode) return false;
    const cuuint64_t dims[5] = {kHeadDim, 2, kPageSize, static_cast<cuuint64_t>(p.num_kv_heads),
                                static_cast<cuuint64_t>(p.num_pages)};
    const cuuint64_t strides[4] = {kHeadDim * 2, kKeyBytes, kPageBytes,
                                   static_cast<cuuint64_t>(p.num_kv_heads) * kPageBytes};
    const cuuint32_t box[5] = {kHeadDim, 1, kPageSize, 1, 1};
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(p.kv_cache), dims, strides, box,
                  elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
}

template <int kCluster>
cudaError_t launch(const Attn2Params& p, cudaStream_t stream) {
  CUtensorMap map;
  if (!kv_map(&map, p)) return cudaErrorInvalidValue;
  const detail::LaunchShape shape{dim3(p.num_splits * kCluster, p.num_kv_heads, p.num_reqs), dim3(kThreads),
                                  kDynSmemBytes, kCluster, p.pdl};
  if (p.num_splits == 1 && p.window == 0)
    return static_cast<cudaError_t>(detail::launch_kernel<attn2_kernel<kCluster, true, false>>(shape, stream, map, p));
  if (p.num_splits == 1)
    return static_cast<cudaError_t>(detail::launch_kernel<attn2_kernel<kCluster, true>>(shape, stream, map, p));
  return static_cast<cudaError_t>(detail::launch_kernel<attn2_kernel<kCluster, false>>(shape, stream, map, p));
}

template <int kCluster, bool kOneSlice, bool kWindow = true>
cudaError_t set_attributes_of() {
  constexpr auto kernel = attn2_kernel<kCluster, kOneSlice, kWindow>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynSmemBytes);
  // The whole unified L1/shared array as shared memory: two CTAs per SM need 2 x 99.3 KB.
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess && kCluster > 8)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return err;
}
template <int kCluster>
cudaError_t set_attributes() {
  cudaError_t err = set_attributes_of<kCluster, false>();
  if (err == cudaSuccess) err = set_attributes_of<kCluster, true>();
  if (err == cudaSuccess) err = set_attributes_of<kCluster, true, false>();
  return err;
}

template <int kCluster>
int max_active_clusters() {
  const detail::LaunchShape shape{dim3(kCluster), dim3(kThreads), kDynSmemBytes, kCluster};
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config = detail::runtime_config(shape, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, attn2_kernel<kCluster, false>, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

#ifdef MUSE_ATTN2_PROBE
extern "C" void muse_attn2_print_probe() {
  unsigned long long h[16][12];
  unsigned int calls = 0;
  if (cudaMemcpyFromSymbol(h, g_probe, sizeof(h)) != cudaSuccess ||
      cudaMemcpyFromSymbol(&calls, g_probe_calls, sizeof(calls)) != cudaSuccess)
    return;
  std::printf("# probe, ns from CTA 0 entry: 1 init, 2 L, 3 wait, 4 Q, 5 tile 0, 6 loop, 7 merged in CTA, 8 cluster merged, 9 out; gap = entry - previous call's out\n");
  for (unsigned int k = calls >= 6 ? calls - 6 : 0; k + 1 < calls; ++k) {
    const auto* r = h[k % 16];
    const auto* prev = h[(k + 15) % 16];
    std::printf("#  gap %6lld |", static_cast<long long>(r[0] - prev[9]));
    for (int i = 1; i < 10; ++i) std::printf(" %6lld", static_cast<long long>(r[i] - r[0]));
    std::printf("\n");
  }
}
#endif

#ifdef MUSE_ATTN2_TRACE
// Writes the ring, oldest record first, as raw 32 x u64 records.
extern "C" void muse_attn2_dump_trace(const char* path) {
  static unsigned long long h[kTraceRing][kTraceWords];
  unsigned int n = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(h, g_ring, sizeof(h)) != cudaSuccess ||
      cudaMemcpyFromSymbol(&n, g_ring_n, sizeof(n)) != cudaSuccess)
    return;
  FILE* f = std::fopen(path, "wb");
  if (!f) return;
  const unsigned int count = n < kTraceRing ? n : kTraceRing;
  for (unsigned int k = n - count; k < n; ++k) std::fwrite(h[k % kTraceRing], sizeof(h[0]), 1, f);
  std::fclose(f);
}
#endif

namespace detail {
int attn2_set_kernel_attributes(int* short_cluster_size) {
  cudaError_t err = set_attributes<8>();
  if (err == cudaSuccess) err = set_attributes<16>();
  if (err != cudaSuccess) return static_cast<int>(err);
  // Clusters of 16 are non-portable: take them only where the GPU can place one.
  *short_cluster_size = max_active_clusters<16>() > 0 ? 16 : 8;
  return 0;
}
int attn2_occupancy(int cluster_size, int* blocks_per_sm, int* max_clusters) {
  cudaError_t err = cudaErrorInvalidValue;
  if (cluster_size == 8) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, attn2_kernel<8, false>, kThreads, kDynSmemBytes);
    *max_clusters = max_active_clusters<8>();
  } else if (cluster_size == 16) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, attn2_kernel<16, false>, kThreads, kDynSmemBytes);
    *max_clusters = max_active_clusters<16>();
  }
  return static_cast<int>(err);
}
int attn2_launch(const Attn2Params& p, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  switch (p.cluster_size) {
    case 8: return static_cast<int>(launch<8>(p, s));
    case 16: return static_cast<int>(launch<16>(p, s));
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}
}  // namespace detail

}  // namespace muse_decode
