// route's shape: one CTA per token, one thread per expert, and the words in
// which the ranking and the metadata tables work, each with a static_assert
// for what the kernel cannot serve.
//
// A token's 256 experts are 8 warps of 32 (lane m: expert warp * 32 + m);
// each warp keeps its 8 best, so 64 finalists are ranked against each other
// for the 8 slots (select.cuh). With metadata the first CTA of the cluster
// holds the tables that every token's CTA ORs its routes into
// (metadata.cuh).
#pragma once

#include <cstdint>

#include "muse_decode/route.h"  // the metadata layout of the contract
#include "params.h"

namespace muse_decode::route_impl {

// ---- threads -----------------------------------------------------------------
inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kFinalists = kWarps * kTopK;  // 64
inline constexpr unsigned kAll = 0xFFFFFFFFu;      // every lane of a warp
static_assert(kThreads == kNumExperts, "one thread per expert (and per local expert in the metadata)");
static_assert(kFinalists <= kThreads, "one thread per finalist");

// ---- the metadata CTA's tables ---------------------------------------------------
// The slot of local expert j in token t's ids is byte t % 4 of word t / 4 of
// its row: a slot is 0..7, and 8 tokens take two words per expert.
inline constexpr int kSlotWords = kRouteMaxTokens / 4;
static_assert(kRouteMaxTokens == 8, "two slot words per expert");
static_assert(kRouteMaxTokens <= 32, "a token is one bit of an expert's token mask");

// Each token's CTA publishes its 8 routes into CTA 0's tables with three
// red.async ORs per route (other ranks' routes OR 0 into a sink word), so
// CTA 0 expects a fixed byte count on one mbarrier and waits for it alone:
// remote atomics and a second cluster barrier, whose release compiles to a
// MEMBAR.ALL.GPU on every thread, cost 0.14 us more per call at every b
// (H200).
inline constexpr uint32_t kPublishBytes = kTopK * 3 * 4;  // per token

}  // namespace muse_decode::route_impl
