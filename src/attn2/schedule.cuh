// Which CTA and warpgroup takes which keys of a (request, KV head): plain
// integer code of the deployment (grid) and the request's length L, the same
// in every CTA, so the merge order (hence the bits) is fixed by L alone.
// Compiled for the host too (tests/cpu/test_attn2_schedule.cc checks that
// every visible key is taken exactly once).
//
// The grid is (slices x C, KV heads, requests); all slices of a (request, KV
// head) share its visible pages. Launches with one slice (num_splits 1:
// max_model_len <= 2048 or a window) are their own kernel instance.
#pragma once

#include <climits>

#include "../common/host_device.h"
#include "config.cuh"

namespace muse_decode::attn2_impl {

// The keys the step's 8 rows see, for a request of length L (the 8 query
// tokens included): [lo, L - 1]; row 0 (position L - 8) starts lowest.
struct KeyRange {
  int len;             // L
  bool broken;         // L outside [8, max_model_len]: a contract break, the rows come out NaN
  int lo;              // first visible key
  int first_page, last_page;
  int first_new_page;  // pages from here on hold this step's keys (written by the kernel before)
};

MUSE_HOST_DEVICE KeyRange key_range(int len, int window, int max_model_len) {
  KeyRange k;
  k.len = len;
  k.broken = len < kVerifyLen || len > max_model_len;
  k.lo = window > 0 ? (len - (kVerifyLen - 1) - window > 0 ? len - (kVerifyLen - 1) - window : 0) : 0;
  k.first_page = k.lo / kPageSize;
  k.last_page = (len - 1) / kPageSize;
  k.first_new_page = (len - kVerifyLen) / kPageSize;
  return k;
}

// The launch as every CTA sees it.
struct Deployment {
  int num_splits;     // slices per (request, KV head)
  int num_kv_heads;
  int num_reqs;
  bool idle_last;     // the split grid fills the GPU exactly: its last cluster is placed last
  bool one_request;   // the grid has one request
};

// A grid that fills the GPU exactly has its last cluster placed last: after
// the kernel before has drained, under PDL 3-4 us after the others (TP8, 14
// clusters of 16), and its loads then queue behind everyone's tile copies.
// Where every slice is in use that cluster takes fewer tiles (wgmma path:
// kLateTiles fewer per warpgroup from kLateMinRounds rounds on; mma.sync
// path: its pair takes one slice fewer). With the slices interleaved the
// grid's last two clusters are the last slice of the last two KV heads, both
// placed late.
MUSE_HOST_DEVICE bool idle_last_cluster(const Deployment& d, int active, int kvh, int req, bool interleaved) {
  const int late_heads = interleaved ? 2 : 1;
  return d.idle_last && active == d.num_splits && active > 2 && kvh >= d.num_kv_heads - late_heads &&
         req == d.num_reqs - 1;
}

// Clusters are placed in launch order (x, then y). With one request and every
// slice in use (at least 8 tiles per warpgroup on average), cluster c in that
// order takes slice c / KVH of KV head c % KVH instead of slice x of head y,
// so that every head's first slices, which carry the most tiles, are placed
// first (TP8 128k: 23.9-24.0 us against 24.6-24.8; below the threshold it
// costs, docs/attn2.md).
MUSE_HOST_DEVICE int interleaved_split(int head_y, int split, const Deployment& d) {
  return (head_y * d.num_splits + split) / d.num_kv_heads;
}
MUSE_HOST_DEVICE int interleaved_kv_head(int head_y, int split, const Deployment& d) {
  return (head_y * d.num_splits + split) % d.num_kv_heads;
}

// Warpgroup `wg` (2 (slice C + rank) + half) of a (request, KV head): its
// tiles of 4 pages, the j-th of which covers pages tile_page0 + 4 tile(j) ..
// (wgmma path).
//
// Tiles go round-robin over the warpgroups of the active slices (one more
// slice per kSlicePages pages per CTA: active grows with L), with three
// exceptions:
// - late: the grid's last cluster (see idle_last_cluster) takes only the
//   first late_rounds rounds, and the tiles after those rounds go round-robin
//   over the other late_wgs warpgroups;
// - pairs (paired_wgs): one slice with up to twice as many tiles as warpgroups:
//   the first paired_wgs warpgroups take the oldest tiles in pairs, both copied
//   before griddepcontrol.wait, and the newest tile (this step's keys, copied
//   after it) is never a warpgroup's second;
// - tail: one slice with one tile more than warpgroups whose odd tile has at
//   most kTailPages pages (a 2048-key window sees 2055 keys: 32 whole tiles
//   and 1-2 pages). The whole tiles end at the newest page and the odd pages
//   are the oldest ones (tile 0 of the range, its slots below the window's
//   first page empty); they go in pieces of 8 keys, one to each of the second
//   warpgroups of the first CTAs, joining the pass over that warpgroup's own
//   tile (S m64n64 + m64n8, one softmax over 72 keys), copied before the wait
//   with it. Window layer 3.80 us against 3.97 with the odd tile a pass of
//   its own.
struct TileSchedule {
  int split, kv_head;  // this cluster's slice and KV head (interleaved where that applies)
  bool interleaved;
  int wg;              // this warpgroup among the pair's: 2 (slice C + rank) + half
  int active;          // slices in use
  int num_tiles;
  int wgs;             // warpgroups of the active slices
  int late_wgs;        // warpgroups taking tiles after the late rounds
  int late_rounds;     // INT_MAX: no late cluster
  int paired_wgs;      // warpgroups that take two tiles in pairs (0: none)
  bool tail;           // the odd tile goes in pieces
  int head_pages;      // (tail) pages of the odd tile
  int tile_page0;      // page of tile 0's first slot (below first_page where the odd tile is short)
  bool has_piece;      // (tail) this warpgroup's second tile is a piece of the odd one
  int piece_at;        // (has_piece) the piece's first 8-key row in its stage
  int my_tiles;        // tiles this warpgroup takes
  // No warpgroup of the cluster fills its last stage, where the receive area
  // lies: each CTA may push its merge rows as soon as its own loop is done.
  bool early_push;

  MUSE_HOST_DEVICE bool leaves() const { return split >= active; }

  // This warpgroup's j-th tile.
  MUSE_HOST_DEVICE int tile(int j) const {
    if (tail) return j == 0 ? wg + 1 : 0;
    if (paired_wgs > 0) return wg < paired_wgs ? 2 * wg + j : wg + paired_wgs;
    return j < late_rounds ? j * wgs + wg : late_rounds * wgs + (j - late_rounds) * late_wgs + wg;
  }
  // The first page of this warpgroup's j-th tile.
  MUSE_HOST_DEVICE int first_page_of(int j) const { return tile_page0 + tile(j) * kTilePages; }
};

template <int kCluster, bool kOneSlice, bool kWindow>
MUSE_HOST_DEVICE TileSchedule tile_schedule(const Deployment& d, const KeyRange& k, int split, int head_y, int rank,
                                            int half, int req) {
  TileSchedule s;
  s.split = split;
  s.kv_head = head_y;
  s.interleaved = false;
  s.num_tiles = k.broken ? 0 : (k.last_page - k.first_page + kTilePages) / kTilePages;
  constexpr int kSliceTiles = kSlicePages / kTilePages * kCluster;
  s.active = kOneSlice ? 1 : (s.num_tiles + kSliceTiles - 1) / kSliceTiles;
  if (s.active > d.num_splits) s.active = d.num_splits;
  if (s.active < 1) s.active = 1;
  if (!kOneSlice && d.one_request && d.num_splits > 1 && s.active == d.num_splits &&
      s.num_tiles >= 8 * d.num_splits * kCluster) {
    s.interleaved = true;
    s.split = interleaved_split(head_y, split, d);
    s.kv_head = interleaved_kv_head(head_y, split, d);
  }
  s.wg = 2 * (s.split * kCluster + rank) + half;
  s.late_rounds = INT_MAX;
  const int rounds = s.num_tiles / (2 * s.active * kCluster);  // whole round-robin rounds
  if (rounds >= kLateMinRounds && idle_last_cluster(d, s.active, s.kv_head, req, s.interleaved))
    s.late_rounds = rounds - kLateTiles;  // >= 1 (config.cuh)
  s.wgs = 2 * s.active * kCluster;
  s.late_wgs = s.late_rounds == INT_MAX ? s.wgs : s.wgs - 2 * kCluster;
  const int pages = k.last_page - k.first_page + 1;
  s.tail = kOneSlice && kWindow && s.num_tiles == s.wgs + 1 && pages - kTilePages * (s.num_tiles - 1) <= kTailPages;
  s.head_pages = s.tail ? pages - kTilePages * (s.num_tiles - 1) : 0;
  s.tile_page0 = k.first_page + (s.tail ? s.head_pages - kTilePages : 0);
  const int head_skip = (k.lo - k.first_page * kPageSize) / 8;  // pieces wholly below the window (0 or 1)
  const int num_pieces = 2 * s.head_pages - head_skip;
  const int piece = (s.wg - 1) / 2;
  s.has_piece = s.tail && s.wg % 2 == 1 && piece < num_pieces;
  s.piece_at = (kTilePages - s.head_pages) * 2 + head_skip + piece;
  s.paired_wgs = !s.tail && s.active == 1 && s.num_tiles > s.wgs && s.num_tiles <= 2 * s.wgs ? s.num_tiles - s.wgs : 0;
  if (s.tail) {
    s.my_tiles = s.has_piece ? 2 : 1;
  } else if (s.paired_wgs > 0) {
    s.my_tiles = s.wg < s.paired_wgs ? 2 : 1;
  } else if (s.late_rounds == INT_MAX) {
    s.my_tiles = s.num_tiles > s.wg ? (s.num_tiles - 1 - s.wg) / s.wgs + 1 : 0;
  } else if (s.wg >= s.late_wgs) {
    s.my_tiles = s.late_rounds;  // (late_rounds * wgs <= num_tiles: every late round is whole)
  } else {
    const int rest = s.num_tiles - s.late_rounds * s.wgs;
    s.my_tiles = s.late_rounds + (rest > s.wg ? (rest - 1 - s.wg) / s.late_wgs + 1 : 0);
  }
  s.early_push = s.late_rounds == INT_MAX && s.num_tiles <= (kWgStages - 1) * s.wgs;
  return s;
}

// The 8-page groups of CTA `me` (slice C + rank) of a (request, KV head)
// (mma.sync path): groups me, me + ctas, ... of the visible pages, one more
// active slice per 2 groups per CTA (L = 2048: 16 groups, one slice, merged
// in the cluster only; from 32k on all of TP8's slices).
struct GroupSchedule {
  int active;
  int me;
  int ctas;        // CTAs of the active slices
  int my_groups;
  bool leaves;
  MUSE_HOST_DEVICE int group(int j) const { return me + j * ctas; }
};

template <int kCluster, bool kOneSlice>
MUSE_HOST_DEVICE GroupSchedule group_schedule(const Deployment& d, const KeyRange& k, int split, int kvh, int rank,
                                              int req) {
  GroupSchedule s;
  const int num_groups = k.broken ? 0 : (k.last_page - k.first_page + kGroupPages) / kGroupPages;
  s.active = kOneSlice ? 1 : (num_groups + 2 * kCluster - 1) / (2 * kCluster);
  if (s.active > d.num_splits) s.active = d.num_splits;
  if (s.active < 1) s.active = 1;
  if (idle_last_cluster(d, s.active, kvh, req, false)) s.active -= 1;
  s.leaves = split >= s.active;
  s.ctas = s.active * kCluster;
  s.me = split * kCluster + rank;
  s.my_groups = num_groups > s.me ? (num_groups - 1 - s.me) / s.ctas + 1 : 0;
  return s;
}

}  // namespace muse_decode::attn2_impl
