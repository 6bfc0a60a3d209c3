// qkv_front's shape: the threads and their roles, the 8 KB weight block, the
// shared-memory plans of the two kernels and the constants that tune them,
// each with the number that set it and a static_assert for what the kernels
// cannot serve.
//
// The weight [N, 8192] is cut into blocks of 64 rows (one head) x 64 columns
// (8 KB, one TMA box, 128-byte swizzle). One producer thread per CTA keeps a
// ring of stages (a weight block and the matching 64 columns of x) in flight;
// 4 consumer warps run mma.sync m16n8k16 with W as A (16 rows per warp) and
// x^T as B (tokens padded to NT n-tiles of 8 by the TMA's zero fill: NT = 1
// for T <= 8, 2 for T <= 16).
#pragma once

#include <cstdint>

#include "../common/hardware.h"
#include "../common/swizzle.cuh"
#include "muse_decode/constants.h"
#include "params.h"

namespace muse_decode::qkv_front_impl {

// ---- threads -----------------------------------------------------------------
inline constexpr int kConsumerWarps = 4;
inline constexpr int kConsumerThreads = kConsumerWarps * 32;
inline constexpr int kProducerWarp = kConsumerWarps;     // its lane 0 issues every copy
inline constexpr int kStagingWarp = kConsumerWarps + 1;  // loads the epilogue's per-token inputs
inline constexpr int kThreads = kConsumerThreads + 64;

// Named barriers (0 is __syncthreads).
enum class FrontBarrier : int {
  kConsumers = 1,  // the 4 consumer warps; the producer and staging warps never join
};

// ---- the weight block and the epilogue tile ------------------------------------
inline constexpr int kWBytes = kFrontTileRows * kFrontBlockK * 2;  // 8 KB: one TMA box of W
inline constexpr int kKSteps = kFrontBlockK / 16;                  // mma k-steps per block
inline constexpr int kYStride = kFrontTileRows + 4;  // floats per token row of the epilogue tile (no bank conflicts)

// What a stage's copies complete on its full barrier: the weight box and x's
// box of NT * 8 token rows (the rows past T zero-filled).
template <int NT>
inline constexpr uint32_t kStageCopyBytes = kWBytes + NT * 8 * kFrontBlockK * 2;

static_assert(kFrontTileRows == kConsumerWarps * 16, "each consumer warp owns 16 rows (one m16 tile) of a head");
static_assert(kFrontBlockK * 2 == swizzle::kRowBytes, "a block row is 128 bytes: the 128-byte TMA swizzle span");
static_assert(kWBytes % swizzle::kAtomBytes == 0, "128-byte swizzled tiles start on 1024 bytes");
static_assert(kHiddenSize % kFrontBlockK == 0, "K splits into whole blocks");
static_assert(kHeadDim == 64 && kFrontTileRows == kHeadDim,
              "a tile is one head, and the epilogue maps lane l to the pair (2l, 2l+1)");
static_assert(kFrontMaxTokens == 16, "at most two n-tiles of 8 tokens");

// ---- the consumers' accumulator chains ---------------------------------------------
// A block's 8 ldmatrix loads are issued before its MMAs, and the MMAs
// alternate over kChains independent accumulators (k-step ks into chain
// ks % kChains, summed in a fixed order after the loop), so a stage costs one
// load latency and a short MMA chain. The cluster kernel takes 2 (H200, TP8
// T = 16: 11.45 us against 11.84 with one), the stream-K kernel 1 (2 cost
// TP1 2 us at T = 16); docs/qkv_front.md has the designs set aside.
inline constexpr int kClusterChains = 2;
inline constexpr int kStreamKChains = 1;
static_assert(kKSteps % kClusterChains == 0 && kKSteps % kStreamKChains == 0,
              "the 4 k-steps of a block split evenly over the chains");

// ---- stream-K kernel (every KV-head count but 2) ------------------------------------
// A persistent grid of one CTA per SM, each under 113 KB of shared memory so
// that two fit: the next launch's CTA sits beside this one and streams its
// weight before this one ends. Ring of kStages stages (8 KB of W, 2 KB reserved for x), then the
// epilogue's token-major tile, the staged cos|sin rows (64 floats per token)
// and slots, and the barriers; 1 KB of slack aligns the ring at run time.
struct StreamKLayout {
  static constexpr int kCtasPerSm = 2;
  static constexpr int kStages = 10;
  // Stages issued before griddepcontrol.wait: all (TP1 0.3-0.5 us faster
  // than 6).
  static constexpr int kEarlyStages = kStages;
  static constexpr int kXBytes = kFrontMaxTokens * kFrontBlockK * 2;  // x box: 8 or 16 token rows
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kYOffset = kStages * kStageBytes;
  static constexpr int kYBytes = kFrontMaxTokens * kYStride * 4;
  static constexpr int kRopeOffset = kYOffset + kYBytes;
  static constexpr int kSlotOffset = kRopeOffset + kFrontMaxTokens * kHeadDim * 4;
  static constexpr int kBarrierOffset = kSlotOffset + kFrontMaxTokens * 8;
  // full and empty per stage, staged, then the CTA's "last to arrive" flag.
  static constexpr int kSmemBytes = swizzle::kAtomBytes /* alignment slack */ + kBarrierOffset + (2 * kStages + 1) * 8 + 16;

  static_assert(kStageBytes % swizzle::kAtomBytes == 0, "128-byte swizzled tiles start on 1024 bytes");
  static_assert(kEarlyStages >= 1 && kEarlyStages <= kStages, "the stages issued early are stages of the ring");
  static_assert(kSmemBytes <= detail::smem_budget_per_cta(kCtasPerSm),
                "two CTAs per SM: the next launch starts beside this one");
};
static_assert(kFrontPartialBytes == kConsumerThreads * 2 * 16, "a workspace partial: one float4 per thread and n-tile");

// ---- cluster kernel (2 KV heads: TP8) ------------------------------------------------
// One cluster of kClusterCtas CTAs per head, each streaming one slice of K:
// 36 heads x 3 = 108 CTAs at TP8, one wave (H200, T = 1: 10.3 us against
// 11.6 with clusters of 4, which do not fit in one wave).
inline constexpr int kClusterCtas = 3;
static_assert(kClusterCtas >= 2 && kClusterCtas <= detail::kPortableClusterSize,
              "a head's partials merge over a portable cluster of two or more CTAs");

// CTAs per SM by n-tile count: the whole shared memory as the ring (192 KB
// of weight in flight per SM) beats leaving room for the next launch's CTA
// (H200, TP8, T <= 8: 10.0-10.1 us against 10.4-10.7).
inline constexpr int kClusterCtasPerSmOneTile = 1;
inline constexpr int kClusterCtasPerSmTwoTiles = 1;

// Ring of stages (W block + x block of NT * 8 tokens) at offset 0, then the
// merge slots (the owner's: one fp32 partial per other CTA of the cluster;
// the epilogue's token-major tile reuses them once summed), the staged
// cos|sin rows and slots, and the barriers. The stage count is what the
// budget leaves: one CTA per SM, NT = 1 24 stages of 9 KB, NT = 2 21 of 10 KB.
template <int NT>
struct ClusterLayout {
  static constexpr int kCtasPerSm = NT == 1 ? kClusterCtasPerSmOneTile : kClusterCtasPerSmTwoTiles;
  static constexpr int kBudget = detail::smem_budget_per_cta(kCtasPerSm);
  static constexpr int kTokens = NT * 8;
  static constexpr int kXBytes = kTokens * kFrontBlockK * 2;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kPartialBytes = kConsumerThreads * NT * 16;  // one float4 per thread and n-tile
  static constexpr int kMergeBytes = (kClusterCtas - 1) * kPartialBytes;
  static constexpr int kRopeBytes = kTokens * kHeadDim * 4;
  static constexpr int kSlotBytes = kTokens * 8;
  static constexpr int kFixedBytes = kMergeBytes + kRopeBytes + kSlotBytes + 2 * 8;  // + staged, merged barriers
  static constexpr int kStages = (kBudget - kFixedBytes) / (kStageBytes + 2 * 8);
  // Stages issued before griddepcontrol.wait: all (H200, TP8, T = 1: 9.84 us
  // against 10.59 with 5 before it and 10.88 with 3). The next launch's CTAs
  // find room only during this one's tail, so what they issue early fills it.
  static constexpr int kEarlyStages = kStages;
  static constexpr int kMergeOffset = kStages * kStageBytes;
  static constexpr int kRopeOffset = kMergeOffset + kMergeBytes;
  static constexpr int kSlotOffset = kRopeOffset + kRopeBytes;
  static constexpr int kBarrierOffset = kSlotOffset + kSlotBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kStages + 2) * 8;

  static_assert(NT == 1 || NT == 2, "one or two n-tiles of 8 tokens");
  static_assert(kStageBytes == kStageCopyBytes<NT>, "a stage holds exactly its copies");
  static_assert(kStageBytes % swizzle::kAtomBytes == 0, "128-byte swizzled tiles start on 1024 bytes");
  static_assert(kTokens * kYStride * 4 <= kMergeBytes, "the epilogue tile fits in the merge slots");
  static_assert(kSmemBytes <= kBudget, "the layout fits kCtasPerSm CTAs per SM");
  static_assert(kStages >= 8, "at least 64 KB of weight in flight per CTA");
  static_assert(kEarlyStages >= 1 && kEarlyStages <= kStages, "the stages issued early are stages of the ring");
};

// ---- instrumentation ------------------------------------------------------------------
// The kernels' named phases (src/common/trace.cuh), stamped by thread 0 (a
// consumer); the record's tag is the launch's CTA count.
enum class Phase : int {
  kEnter,
  kInitSynced,  // the barriers initialised, the next launch allowed to start
  kWaited,      // past griddepcontrol.wait
  kLoopDone,    // the CTA's last weight block multiplied
  kExit,        // partials pushed (cluster ranks > 0) or the epilogue written
};

}  // namespace muse_decode::qkv_front_impl
