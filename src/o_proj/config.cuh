// o_proj's shape: the threads and their roles, the weight and x blocks, and
// the shared-memory plan of one kernel instance, each knob a constexpr with a
// static_assert for what the kernel cannot serve.
//
// A CTA owns kRows consecutive output columns (weight rows) over all of K:
// no split of K crosses CTAs, so there is no merge, no workspace, and the sum
// order is fixed by the code alone. K is cut into blocks of 64 columns (128
// bytes per row: one TMA box, 128-byte swizzle). The weight ring holds
// kWStages blocks of the CTA's rows; the x ring kXStages blocks of x (all
// NT * 8 token rows, those past T zero-filled by the TMA). 4 consumer warps
// run mma.sync m16n8k16 with W as A (kRowTiles m16 tiles) and x^T as B
// (tokens as n): warp w takes the kMTilesPerWarp m-tiles of its row group
// (w % kRowGroups) and the k-steps of its k-group (w / kRowGroups), and the
// k-groups are added in group order at the end.
#pragma once

#include <cstdint>

#include "../common/arch_features.cuh"
#include "../common/hardware.h"
#include "../common/swizzle.cuh"
#include "muse_decode/o_proj.h"
#include "params.h"

namespace muse_decode::o_proj_impl {

// ---- threads -----------------------------------------------------------------
inline constexpr int kConsumerWarps = 4;
inline constexpr int kConsumerThreads = kConsumerWarps * 32;
inline constexpr int kProducerWarp = kConsumerWarps;       // its lane 0 issues the weight's copies
inline constexpr int kXProducerWarp = kConsumerWarps + 1;  // its lane 0 issues x's, after griddepcontrol.wait
inline constexpr int kThreads = kConsumerThreads + 64;

// Named barriers (0 is __syncthreads).
enum class OProjBarrier : int {
  kConsumers = 1,  // the 4 consumer warps; the producer warps never join
};

// ---- blocks ----------------------------------------------------------------------
inline constexpr int kBlockK = 64;               // 64 bf16 = 128 bytes per row
inline constexpr int kKSteps = kBlockK / 16;     // mma k-steps per block
inline constexpr int kRowBytes = kBlockK * 2;    // a block row: the 128-byte swizzle span
inline constexpr int kMaxBlocks = 8192 / kBlockK;  // K = 8192 (TP1)
static_assert(kRowBytes == swizzle::kRowBytes, "a block row is 128 bytes: the 128-byte TMA swizzle span");
static_assert(o_proj_in_width(1) % kBlockK == 0, "every supported K splits into whole blocks");

// n-tiles of 8 tokens a call of T tokens takes (1, 2, 4 or 8): the token
// rows of its x box, zero-filled past T.
constexpr int n_tiles_for(int num_tokens) {
  return num_tokens <= 8 ? 1 : num_tokens <= 16 ? 2 : num_tokens <= 32 ? 4 : 8;
}
static_assert(n_tiles_for(kOProjMaxTokens) * 8 == kOProjMaxTokens, "64 tokens: 8 n-tiles");

// ---- one kernel instance ---------------------------------------------------------
// A kernel instance is a Tuning and an n-tile count NT (n-tiles of 8 tokens:
// 1, 2, 4 or 8). A Tuning names, as static constexpr members:
//   kRowTiles       m16 tiles per CTA (1, 2 or 4: 16, 32 or 64 output columns)
//   kCtasPerSm      CTAs of the kernel that fit on one SM (the shared-memory budget of one)
//   kWStages        weight blocks in the ring (>= K / 64: the CTA's whole share sits in shared memory)
//   kMTilesPerWarp  m-tiles each consumer warp multiplies by the same x fragments (2 halves the
//                   shared-memory reads of x)
//   kHeldBlocks     weight blocks the consumer warps load into registers before x exists, so that
//                   their stages take later blocks before griddepcontrol.wait too (the weight that
//                   leaves before the wait is kWStages + kHeldBlocks blocks)
//   kWgmma          where the architecture has wgmma, the 4 consumer warps multiply as one
//                   warpgroup (wgmma m64nNk16, both operands read from the stages, N = NT * 8 token
//                   rows); warp w then holds the sums of m-tile w, so the compiled configuration has
//                   one m-tile per warp and no k-groups. Elsewhere kMTilesPerWarp holds.
//   kXCluster       CTAs per cluster that share x's boxes (1: none): rank r copies every block b
//                   with b % kXCluster == r once, multicast into all of them, so the L2 serves each
//                   of x's lines to 128 / kXCluster CTAs, not 128. Every block of x then needs its
//                   own stage (a fill per launch, no stage to free across CTAs).
// The x ring takes what the budget leaves, up to kMaxXStages.
template <typename Tuning, int NT_>
struct Config {
  static constexpr int kRowTiles = Tuning::kRowTiles;
  static constexpr int NT = NT_;
  static constexpr int kCtasPerSm = Tuning::kCtasPerSm;
  static constexpr int kWStages = Tuning::kWStages;
  static constexpr bool kWgmma = Tuning::kWgmma && arch::kHasWgmma;  // in this compilation: sm_90a
  static constexpr int kMTilesPerWarp = kWgmma ? 1 : Tuning::kMTilesPerWarp;
  static constexpr int kHeldBlocks = Tuning::kHeldBlocks;
  static constexpr int kXCluster = Tuning::kXCluster;

  static constexpr int kRows = 16 * kRowTiles;                     // output columns per CTA
  static constexpr int kCtas = kOProjOutWidth / kRows;             // the grid, whatever K and T
  static constexpr int kRowGroups = kRowTiles / kMTilesPerWarp;    // warps side by side along the rows
  static constexpr int kKGroups = kConsumerWarps / kRowGroups;     // warps sharing each row group's k-steps
  static constexpr int kStepsPerWarp = kKSteps / kKGroups;
  static constexpr int kTokens = NT * 8;
  // Independent accumulator chains per warp: one per k-step it takes while
  // its m-tiles and n-tiles alone leave the tensor pipe idle between
  // dependent MMAs, fewer once the MMAs of a k-step already overlap.
  static constexpr int kMmasPerStep = kMTilesPerWarp * NT;
  static constexpr int kChains = kMmasPerStep <= 2 ? kStepsPerWarp : kMmasPerStep == 4 && kStepsPerWarp >= 2 ? 2 : 1;

  static constexpr int kWBytes = kRows * kRowBytes;   // one weight box
  static constexpr int kXBytes = kTokens * kRowBytes;  // one x box
  static constexpr int kBudget = detail::smem_budget_per_cta(kCtasPerSm);
  // More x stages than TP8's 16 blocks buy nothing: x is an L2 hit.
  static constexpr int kMaxXStages = 16;
  static constexpr int kBarrierBytes = (2 * kWStages + 2 * kMaxXStages) * 8;  // full + empty per stage
  static constexpr int kXStagesFit = (kBudget - kWStages * kWBytes - kBarrierBytes) / kXBytes;
  static constexpr int kXStages = kXStagesFit < kMaxXStages ? kXStagesFit : kMaxXStages;

  // Layout: the weight ring at 0 (1024-byte aligned: the swizzle's period),
  // then the x ring, then the barriers. Once every block is consumed the
  // rings hold the k-groups' partial sums (kPartialOffset) and the bf16
  // output tile (kOutTileOffset).
  static constexpr int kXOffset = kWStages * kWBytes;
  static constexpr int kBarrierOffset = kXOffset + kXStages * kXBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kWStages + 2 * kXStages) * 8;
  static constexpr int kPartialBytes = 32 * NT * 16;  // one m16 tile's NT*8 token sums, a float4 per lane and n-tile
  static constexpr int kPartialOffset = 0;
  static constexpr int kOutTileOffset = (kKGroups - 1) * kRowTiles * kPartialBytes;
  static constexpr int kOutTileBytes = kTokens * kRows * 2;  // [token][kRows] bf16

  static_assert(kRowTiles == 1 || kRowTiles == 2 || kRowTiles == 4, "16, 32 or 64 output columns per CTA");
  static_assert(Tuning::kMTilesPerWarp >= 1 && kRowTiles % Tuning::kMTilesPerWarp == 0,
                "each m-tile group of a warp divides the CTA's m-tiles");
  static_assert(kMTilesPerWarp >= 1 && kRowTiles % kMTilesPerWarp == 0 && kConsumerWarps % kRowGroups == 0,
                "the warps split the m-tiles evenly, each row group over whole k-groups");
  static_assert(kKSteps % kKGroups == 0, "each k-group takes whole k-steps of a block");
  static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "1, 2, 4 or 8 n-tiles of 8 tokens");
  static_assert(kOProjOutWidth % kRows == 0, "the grid covers the 8192 output columns exactly");
  static_assert(kWStages >= 2 && kWStages <= kMaxBlocks, "a weight ring of 2 .. 128 blocks");
  static_assert(kHeldBlocks >= 0 && kHeldBlocks <= kWStages, "the blocks held in registers are the first ring's");
  static_assert(!Tuning::kWgmma || (kRowTiles == 4 && kHeldBlocks == 0 && (NT == 1 || NT == 4 || NT == 8)),
                "a wgmma configuration: one 64-row warpgroup tile, no held blocks, N = 8, 32 or 64 tokens");
  static_assert(kWBytes % swizzle::kAtomBytes == 0 && kXBytes % swizzle::kAtomBytes == 0,
                "128-byte swizzled boxes start on 1024 bytes");
  static_assert(kXStages >= 2, "the budget leaves at least two x stages (x streams while the weight sits)");
  static_assert(kXCluster == 1 || kXCluster == 2 || kXCluster == 4 || kXCluster == 8, "x shared by 1, 2, 4 or 8 CTAs");
  static_assert(kXCluster == 1 || kXStages >= o_proj_in_width(2) / kBlockK,
                "x multicast: a stage for each of short K's blocks (the dispatch sends K >= 2048 elsewhere)");
  static_assert(kCtas % kXCluster == 0, "the grid is whole clusters");
  static_assert(kSmemBytes <= kBudget, "the layout fits kCtasPerSm CTAs per SM");
  static_assert(kOutTileOffset + kOutTileBytes <= kBarrierOffset,
                "the partial sums and the output tile fit in the drained rings");
  static_assert(kRows * 2 % 16 == 0, "a token's output columns are whole 16-byte chunks");
};

// ---- instrumentation ------------------------------------------------------------------
// The kernel's named phases (src/common/trace.cuh), stamped by thread 0 (a
// consumer); the record's tag is the launch's CTA count.
enum class Phase : int {
  kEnter,
  kInitSynced,  // the barriers initialised, the next launch allowed to start
  kHeld,        // the held blocks' fragments in registers (the weight before the wait)
  kFirstX,      // x's first block landed: the previous kernel is done
  kLoopDone,    // the last block multiplied
  kExit,        // the output tile written
};

}  // namespace muse_decode::o_proj_impl
