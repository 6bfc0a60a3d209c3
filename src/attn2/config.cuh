// attn2's shape: rows, warps, stages, tiles and the shared-memory plan, each
// constant with the arithmetic that sets it, and a static_assert for what the
// kernel cannot serve.
//
// A CTA holds the 64 query rows (8 tokens x 8 heads) of one (request, KV
// head) and 8 warps in two halves: warps w and w + 4 own the same 16 rows
// (heads 2w, 2w + 1) and take different keys, so that a warp's S tile is
// 16 x 64 (32 registers) and each scheduler has 4 warps to switch between
// (with one half, a warp's ldmatrix -> mma -> exp2 chain left the issue slots
// idle 62% of the time). Two CTAs per SM. A cluster of C CTAs (8 or 16)
// shares one key slice of the (request, KV head) and merges its C states
// through distributed shared memory.
#pragma once

#include <cstdint>

#include "../common/arch_features.cuh"
#include "../common/hardware.h"
#include "../common/swizzle.cuh"
#include "muse_decode/constants.h"

// The key loop: wgmma on sm_90a (the H200), mma.sync everywhere else (sm_100a
// has no wgmma). MUSE_ATTN2_SM90_MMA_SYNC=1 builds the mma.sync loop for
// sm_90a as well, so that the sm_100a code runs on a Hopper GPU (its tests
// and benchmark); CMake's option of the same name sets it.
#ifndef MUSE_ATTN2_SM90_MMA_SYNC
#define MUSE_ATTN2_SM90_MMA_SYNC 0
#endif

namespace muse_decode::attn2_impl {

inline constexpr bool kWgmma = arch::kHasWgmma && !MUSE_ATTN2_SM90_MMA_SYNC;

// ---- threads -------------------------------------------------------------------
inline constexpr int kRows = kVerifyLen * kHeadsPerKvHead;  // 64 query rows per (request, KV head)
inline constexpr int kRowWarps = 4;                         // 16 rows (one m16 tile) each
inline constexpr int kKeyHalves = 2;                        // warps w and w + 4 split the keys
inline constexpr int kWarps = kRowWarps * kKeyHalves;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kHalfThreads = kRowWarps * 32;         // one half: a warpgroup on the wgmma path
inline constexpr int kMinBlocks = 2;                        // CTAs per SM

static_assert(kHeadDim == 64, "attn2 hard-wires head_dim 64: 4 k-steps of 16 for S, 8 n-tiles of 8 for O");
static_assert(kHeadsPerKvHead == 8 && kVerifyLen == 8, "attn2 hard-wires 8 heads x 8 tokens = 64 rows: 4 warps x m16");
static_assert(kPageSize == 16, "a page is 16 keys: one n-tile pair of S per key position");
static_assert(kHalfThreads == 128, "a half is one warpgroup of the wgmma path");


// log2(e) * softmax scale: scores live in the log2 domain, exp2 on the MUFU.
// From the scale in double (head_dim^-0.5 * qk_scale_factor),
// rounded to fp32 once.
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr float kScaleLog2 = static_cast<float>(kQkScaleFactor / 8.0 * kLog2e);
static_assert(static_cast<float>(kQkScaleFactor / 8.0) == kSoftmaxScale, "8 = sqrt(head_dim)");

// ---- the KV cache ----------------------------------------------------------------
inline constexpr int kKeyBytes = kCacheRowWidth * 2;        // 256: K | V of one key
inline constexpr int kPageBytes = kPageSize * kKeyBytes;    // 4096: one (page, KV head) slot

// ---- wgmma key loop (sm_90a) -------------------------------------------------------
// Each half is a warpgroup consuming its own 64-key tiles (4 pages) through
// kWgStages stages; warp 0 of the warpgroup copies a page's K and V boxes by
// TMA (128-byte swizzled, the layout wgmma reads without bank conflicts).
inline constexpr int kTilePages = 4;
inline constexpr int kTileKeys = kTilePages * kPageSize;    // 64: N of S = Q K^T, K of O += P V
inline constexpr int kWgStages = 3;                         // per warpgroup
inline constexpr int kHalfBytes = kTileKeys * kHeadDim * 2; // 8192: K (or V) of a tile
inline constexpr int kWgStageBytes = 2 * kHalfBytes;        // K then V
inline constexpr int kQTileBytes = kRows * kHeadDim * 2;    // 8192, swizzled like K
// Tiles per warpgroup copied before griddepcontrol.wait. One: the copies of
// all 3 stages (21 MB at TP8 128k) fill the memory system while the kernel
// before still merges, and its tail's round trips wait behind them (TP8 128k
// 25.9 us against 27.1 with 3, 32k 11.7 against 12.2).
inline constexpr int kEarlyTiles = 1;
// Pages per CTA and slice before another slice joins: a split launch's
// active slices grow with L in steps of kSlicePages * C pages.
inline constexpr int kSlicePages = 8;
// One slice with one tile more than warpgroups, that tile of at most
// kTailPages pages (a 2048-key window: 129 or 130 pages): its keys join the
// passes of whole tiles in pieces of 8 (schedule.cuh).
inline constexpr int kTailPages = 2;
// The grid's last cluster, placed last under PDL (schedule.cuh): kLateTiles
// fewer tiles per warpgroup from kLateMinRounds round-robin rounds on (TP8
// 128k 22.28-22.45 us against 23.61-23.80 with none; docs/attn2.md has 1
// and 3).
inline constexpr int kLateTiles = 2;
inline constexpr int kLateMinRounds = 4;

static_assert(kWgStages >= 2, "the next tile's S overlaps the current P V: two stages at least");
static_assert(kEarlyTiles >= 1 && kEarlyTiles <= kWgStages, "tiles copied before the wait fit in the ring");
static_assert(kLateTiles < kLateMinRounds, "the late cluster keeps at least one tile per warpgroup");
static_assert(kSlicePages % kTilePages == 0, "a slice step is whole tiles");
static_assert(kTailPages <= kTilePages / 2, "the odd tile's pieces fit in a stage beside a whole tile's pages");

// ---- mma.sync key loop (sm_100a; sm_90a with MUSE_ATTN2_SM90_MMA_SYNC) -------------
// Warp 0 copies whole (page, KV head) slots with cp.async.bulk, one 8-page
// group per stage; warps w and w + 4 take keys 0-7 and 8-15 of every page.
// A key row is 256 bytes, so the 8 rows an ldmatrix reads of one page would
// fall on the same banks: one 8x8 matrix takes key t of each of the group's 8
// pages instead, the 8 page slots 4096 + 16 bytes apart (8 bank groups).
inline constexpr int kGroupPages = 8;                       // pages per stage: one per bank group
inline constexpr int kGroupKeys = kGroupPages * kPageSize;  // 128
inline constexpr int kKeyTiles = kPageSize / kKeyHalves;    // 8: n-tiles of S per warp (keys of a page)
inline constexpr int kStages = 3;
inline constexpr int kSlotBytes = kPageBytes + 16;          // staggered by one bank group
inline constexpr int kStageBytes = kGroupPages * kSlotBytes;  // 32896
inline constexpr int kStagesBytes = kStages * kStageBytes;    // 98688
inline constexpr int kQStride = kHeadDim + 8;               // bf16 per Q row: 144 B, conflict-free ldmatrix
inline constexpr int kMmaSmemBytes = kStagesBytes + kRows * kQStride * 2;  // stages, then the Q tile

static_assert(kSlotBytes % 16 == 0 && kStageBytes % 128 == 0, "bulk copies need 16-byte alignment");

// ---- after the key loop: merges (merge.cuh) ---------------------------------------
// The stages are free then and hold, from their start: the fp16 merge area
// (each CTA's O before the cluster merge pushes it), the key-half exchange
// (the second half's state: 9 float4 per thread), and, in warpgroup 0's last
// stage, the receive area of the cluster merge (the other ranks push into it,
// so it must not hold keys once any CTA of the cluster may push).
inline constexpr int kMergeStrideH = kHeadDim + 8;           // halves per fp16 merge row: 144 B, conflict-free
inline constexpr int kExchangeOffset = kRows * kMergeStrideH * 2;
inline constexpr int kExchangeEnd = kExchangeOffset + kHalfThreads * 9 * 16;
inline constexpr int kRecvOffset = (kWgStages - 1) * kWgStageBytes + 4096;  // 36 KB in
inline constexpr int kRecvBytes = kRows * (kHeadDim * 2 + 16);  // 9216: 64 rows of fp16 O, then (m, l, 2^e)

// ---- the shared-memory plan ----------------------------------------------------------
inline constexpr int kWgSmemBytes = 2 * kWgStages * kWgStageBytes + kQTileBytes + swizzle::kAtomBytes;  // + the alignment
inline constexpr int kDynSmemBytes = kMmaSmemBytes > kWgSmemBytes ? kMmaSmemBytes : kWgSmemBytes;
inline constexpr int kBarriers = 2 * kWgStages > kStages ? 2 * kWgStages : kStages;
// The kernel's static shared memory (barriers, per-row merge state, gate) stays under this.
inline constexpr int kStaticSmemBound = 2560;

static_assert(kExchangeOffset % 16 == 0, "the exchange holds float4s");
static_assert(kExchangeEnd <= kRecvOffset, "the exchange lies before the receive area");
static_assert(kRecvOffset + kRecvBytes <= kStagesBytes && kRecvOffset + kRecvBytes + 1024 <= 2 * kWgStages * kWgStageBytes,
              "the receive area lies in the stages of both paths");
static_assert(kRecvOffset >= (kWgStages - 1) * kWgStageBytes + 1024 &&
                  kRecvOffset + kRecvBytes <= kWgStages * kWgStageBytes,
              "the receive area lies in warpgroup 0's last stage only");
static_assert(kMinBlocks * (kDynSmemBytes + kStaticSmemBound + detail::kSmemReservedPerCta) <= detail::kSmemPerSm,
              "kMinBlocks CTAs per SM: stages, the Q tile, barriers, gate and merge state");

// ---- instrumentation ------------------------------------------------------------------
// The kernel's named phases (trace.cuh); a split launch's CTAs tag their
// record with slice | KV head << 8 | rank << 24.
enum class Phase : int {
  kEnter,
  kInitSynced,
  kLength,        // L arrived
  kScheduled,
  kFirstIds,      // the first tile's page ids arrived
  kEarlyIssued,   // the copies before griddepcontrol.wait issued
  kWaited,        // past griddepcontrol.wait
  kAllIssued,
  kQStaged,
  kFirstTile,     // the first tile's copies landed
  kFirstScores,
  kFirstSoftmax,
  kSecondTile,
  kLastTile,
  kLoopDone,      // the last P V done
  kHalvesDone,
  kStateStored,   // this CTA's rows ready to push
  kClusterSynced,
  kClusterMerged,
  kPartialStored,
  kTicket,
  kMerged,        // the split merge's partials read
  kExit,
};

}  // namespace muse_decode::attn2_impl
