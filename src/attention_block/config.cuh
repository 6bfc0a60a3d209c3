// attention_block's shape: the threads and their roles in each phase, the
// shared-memory plan, the counters by which the phases of different CTAs
// meet, and the share of each phase's work that a share takes.
//
// One CTA per SM runs the phases of its shares in order:
//   front      qkv_front's stream-K loop (its producer, consumers, merge and
//              epilogue) over the share's run of weight blocks, token group
//              by token group (16 rows at a time); each head's epilogue
//              counts the head as ready for its KV head
//   attention  one key slice of one (request, KV head): its older pages copy
//              while the front ends, the rest after that KV head's q, k and v
//              are ready; attn2's mma.sync group step; the two key halves
//              merged; the slice's partial (m, l, O) to the workspace
//   merge      rows of the (request, KV head) over all its slices, then
//              attn2's o-norm and gate: o_proj's x, counted per token group
//   o_proj     64 output columns over all of K: the weight streams into
//              shared memory when the front ends, x after its rows are counted
// Every wait is on a counter in the workspace that CTAs of the same
// cooperative launch raise, so each waits only on resident CTAs.
#pragma once

#include <cstdint>

#include "../attn2/config.cuh"
#include "../common/hardware.h"
#include "../common/swizzle.cuh"
#include "../qkv_front/config.cuh"
#include "muse_decode/constants.h"
#include "params.h"

namespace muse_decode::attention_block_impl {

// ---- threads ---------------------------------------------------------------------
inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
// front and o_proj: warps 0-3 multiply (qkv_front's consumer warps), warp 4
// copies, warp 5 stages the front's epilogue inputs; attention and merge:
// all 8 (attn2's row warps and key halves).
inline constexpr int kMmaWarps = qkv_front_impl::kConsumerWarps;
inline constexpr int kCopyWarp = kMmaWarps;
inline constexpr int kStagingWarp = kMmaWarps + 1;  // the front's first token group's cos|sin rows and slots
static_assert(kMmaWarps == 4 && qkv_front_impl::kConsumerThreads == 128, "qkv_front's 4 consumer warps");
static_assert(attn2_impl::kWarps == kWarps, "attn2's 8 warps: 4 row warps x 2 key halves");

// ---- the front ---------------------------------------------------------------------
// A stage: one 8 KB weight block and the matching 64 columns of x for 8 or 16
// token rows (qkv_front's stage, sized for 16).
inline constexpr int kFrontStageBytes = qkv_front_impl::kWBytes + kTokenGroup * qkv_front_impl::kFrontBlockK * 2;
// 12 stages: 96 KB of weight in flight per SM, 12.7 MB over the GPU, about
// three times what 4.2 TB/s needs at the memory's latency. Deeper rings only
// lengthen the queues every merge, count and poll waits in (H200, TP8: 20
// stages ran 1 us slower at each shape).
inline constexpr int kFrontStages = 12;
inline constexpr int kFrontRingBytes = kFrontStages * kFrontStageBytes;
// qkv_front's epilogue tile, staged cos|sin rows and slots, after the ring.
inline constexpr int kEpiYOffset = kFrontRingBytes;
inline constexpr int kEpiYBytes = kTokenGroup * qkv_front_impl::kYStride * 4;
inline constexpr int kEpiRopeOffset = kEpiYOffset + kEpiYBytes;
inline constexpr int kEpiSlotOffset = kEpiRopeOffset + kTokenGroup * kHeadDim * 4;
inline constexpr int kFrontEnd = kEpiSlotOffset + kTokenGroup * 8;
static_assert(kFrontStageBytes % swizzle::kAtomBytes == 0, "128-byte swizzled boxes start on 1024 bytes");

// ---- o_proj's weight, then the attention's stages ---------------------------------
// o_proj's share: 64 output columns (4 warps x m16) over K, in 8 KB blocks of
// 64 columns of K, a ring of kWStages blocks from offset 0, copied as the
// front ends: 14 of TP8's 16 blocks (the last two follow as the first two
// are multiplied), 14 of TP4's 32. 14 and not 16 leave room for a third key
// stage: with two the keys streamed at 2.8 TB/s (TP8, 128k).
inline constexpr int kOutTileCols = 64;
inline constexpr int kOutTiles = kHiddenSize / kOutTileCols;  // 128
inline constexpr int kWStages = 14;
inline constexpr int kWBlockBytes = qkv_front_impl::kWBytes;
inline constexpr int kWRingBytes = kWStages * kWBlockBytes;  // 112 KB
static_assert(kOutTiles <= kShares, "every o_proj tile has a share");

// attn2's mma.sync stages (8 page slots each) and its Q tile, after the weight.
inline constexpr int kKeyStages = 3;
inline constexpr int kKeyRingOffset = kWRingBytes;
inline constexpr int kQTileOffset = kKeyRingOffset + kKeyStages * attn2_impl::kStageBytes;
inline constexpr int kQTileBytes = attn2_impl::kRows * attn2_impl::kQStride * 2;
inline constexpr int kAttnEnd = kQTileOffset + kQTileBytes;
// After the key loop its stages hold the key-halves' exchange (attn2's) and
// the merge's per-warp states.
inline constexpr int kExchangeBytes = attn2_impl::kHalfThreads * 9 * 16;
static_assert(kExchangeBytes <= kKeyStages * attn2_impl::kStageBytes, "the exchange fits in the key stages");
// o_proj's x for one token group (16 rows x K) once the attention is done,
// in boxes of 64 columns, from the key stages on.
inline constexpr int kXOffset = kKeyRingOffset;
inline constexpr int kXBoxBytes = kTokenGroup * 64 * 2;  // 2 KB
inline constexpr int kMaxInWidth = 4 * kHeadsPerKvHead * kHeadDim;  // K at 4 KV heads: 2048
static_assert(kXOffset + (kMaxInWidth / 64) * kXBoxBytes <= kAttnEnd + 8192, "x of 16 rows fits after the weight");

inline constexpr int kPlanBytes = (kFrontEnd > kAttnEnd ? kFrontEnd : kAttnEnd);
inline constexpr int kXEnd = kXOffset + (kMaxInWidth / 64) * kXBoxBytes;
inline constexpr int kSmemBytes = swizzle::kAtomBytes /* alignment slack */ + (kPlanBytes > kXEnd ? kPlanBytes : kXEnd);
static_assert(kSmemBytes + 6144 /* static: barriers, merge states */ <= detail::smem_budget_per_cta(1), "one CTA per SM");
// The weight, the key stages and the Q tile overlap the front's ring and
// epilogue area: a CTA copies into them once its front is done.

// ---- counters (uint32 words of the workspace's counter part) -------------------------
// Word 0: the launches that have ended on this workspace (the epoch e), which
// CTA 0 advances as it leaves; every CTA has read it by then, since CTA 0's
// last phase waits on work of every CTA. Two sets of phase counters follow:
// launch e counts in set e % 2 while its CTA 0 zeroes set (e + 1) % 2 for the
// next launch (launch e - 1, the last to use it, has ended). So no CTA waits
// at the end for the others to leave, and any grid may follow any other.
struct Counters {
  static constexpr int kEpoch = kEpochWord;
  static constexpr int kSets = kCounterSets;  // the two sets' first word
  static constexpr int kSetWords = kCounterSetWords;
  // Within a set:
  static constexpr int kHeadReady = 0;    // [group][kvh]: q, k and v heads written (8 + 2 each)
  static constexpr int kGateReady = 48;   // [group][kvh]: gate heads written (8 each)
  static constexpr int kSlicesDone = 112; // [request * KVH + kvh]: slices' partials published
  static constexpr int kRowsDone = 240;   // [group]: o_proj x rows written (64 per (request, KV head))
  static constexpr int kEnd = 248;
};
static_assert(Counters::kEnd <= Counters::kSetWords, "a set holds every phase counter");
static_assert(Counters::kSets + 2 * Counters::kSetWords <= kCounterWords, "both sets fit in the counter part");
static_assert(kMaxReqs * 4 <= Counters::kRowsDone - Counters::kSlicesDone, "a slice counter per (request, KV head)");
static_assert((kMaxReqs * kVerifyLen / kTokenGroup) * 4 <= Counters::kGateReady - Counters::kHeadReady,
              "a ready counter per (token group, KV head)");

// ---- instrumentation ------------------------------------------------------------------
// The kernel's named phases (src/common/trace.cuh), stamped by thread 0; the
// record's tag is the launch's CTA count.
enum class Phase : int {
  kEnter,
  kFrontLoopDone,  // the CTA's last front block multiplied
  kFrontDone,    // the CTA's front shares multiplied, merged and finished
  kHeadsReady,   // (first slice) its KV head's q, k and v counted
  kQStaged,      // (first slice) Q in shared memory
  kKeysDone,     // (first slice) its last group multiplied
  kSliceDone,    // (last slice) its partial published
  kSlicesReady,  // (first merge) every slice of its pair published
  kMerged,       // every merge of the CTA written
  kXLanded,      // (first o_proj tile) x in shared memory
  kExit,
};

}  // namespace muse_decode::attention_block_impl
