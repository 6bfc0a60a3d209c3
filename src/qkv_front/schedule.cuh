// Which CTA streams which weight blocks, and so which CTAs' partial sums a
// head's merge adds, in which order: plain integer code of the launch's grid
// and KV-head count, the same in every CTA, so the order of the sums (hence
// the bits) never depends on timing or on how the kernel was launched.
#pragma once

#include <cstdint>

#include "config.cuh"

namespace muse_decode::qkv_front_impl {

// ---- stream-K ------------------------------------------------------------------
// The blocks of every tile (head) numbered tile-major; CTA c of G owns blocks
// [c * B / G, (c + 1) * B / G) of the B blocks, so the busiest SM reads one
// block more than the least busy. A tile cut between CTAs is summed in CTA
// (= K) order by the last of them to arrive.
struct StreamKWork {
  int tiles;       // heads of the launch: 2 (8 + 1) per KV head
  int64_t blocks;  // tiles * 128
  int ctas, cta;
  int64_t begin, end;  // this CTA's blocks

  __device__ __forceinline__ static StreamKWork of_this_cta(int num_kv_heads) {
    StreamKWork w;
    w.tiles = 2 * (kHeadsPerKvHead + 1) * num_kv_heads;
    w.blocks = int64_t{w.tiles} * kFrontBlocksPerTile;
    w.ctas = gridDim.x;
    w.cta = blockIdx.x;
    w.begin = w.cta * w.blocks / w.ctas;
    w.end = (w.cta + 1) * w.blocks / w.ctas;
    return w;
  }

  // The CTA owning block `blk`: the largest c with floor(c * blocks / ctas) <= blk.
  __device__ __forceinline__ int owner_of(int64_t blk) const {
    return static_cast<int>(((blk + 1) * ctas + blocks - 1) / blocks) - 1;
  }
};

// The part of one tile that this CTA streams from block b on: blocks [b, end).
struct Segment {
  int tile;
  int64_t tile_begin, tile_end;
  int64_t end;
  bool whole;  // the CTA streams the whole tile: no merge

  __device__ __forceinline__ static Segment at(int64_t b, int64_t cta_end) {
    Segment s;
    s.tile = static_cast<int>(b / kFrontBlocksPerTile);
    s.tile_begin = int64_t{s.tile} * kFrontBlocksPerTile;
    s.tile_end = s.tile_begin + kFrontBlocksPerTile;
    s.end = cta_end < s.tile_end ? cta_end : s.tile_end;
    s.whole = b == s.tile_begin && s.end == s.tile_end;
    return s;
  }
};

// ---- cluster ---------------------------------------------------------------------
// A head's 128 K blocks over its cluster's kClusterCtas CTAs: rank 0, the
// owner, streams the first kOwnerBlocks; rank r >= 1 the next kOtherBlocks,
// the last rank up to the end of K. The owner's slice is the longer one, so
// that the others' partials arrive while it still streams. H200, TP8, PDL:
// one n-tile 44 (44 / 42 / 42; T = 8 10.01 us against 10.16 with 46 and 10.34
// with 50; 54 ran 9.71 but 13.0 against 12.2 without PDL); two n-tiles,
// whose epilogue is longer, 54 (54 / 37 / 37), so that the other two CTAs
// leave early and the next launch's CTAs take their SMs (T = 16 10.20 us
// against 10.47 with 50 and 10.79 with 44). The same whether PDL is on or
// off: the split sets the order of the sums.
template <int NT>
struct ClusterSplit {
  static constexpr int kOwnerBlocks = NT == 1 ? 44 : 54;
  static constexpr int kOtherBlocks = (kFrontBlocksPerTile - kOwnerBlocks) / (kClusterCtas - 1);
  static_assert(kOwnerBlocks >= 1 && kOtherBlocks >= 1, "the owner's blocks leave every other rank at least one block");

  // Blocks [begin, end) of K of the cluster's CTA `rank`.
  struct Slice {
    int begin, end;
  };
  __device__ __forceinline__ static Slice of_rank(uint32_t rank) {
    const int r = static_cast<int>(rank);
    const int begin = rank == 0 ? 0 : kOwnerBlocks + (r - 1) * kOtherBlocks;
    const int end = rank == 0 ? kOwnerBlocks : r == kClusterCtas - 1 ? kFrontBlocksPerTile : begin + kOtherBlocks;
    return {begin, end};
  }
};

}  // namespace muse_decode::qkv_front_impl
