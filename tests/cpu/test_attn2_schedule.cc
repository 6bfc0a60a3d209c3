// attn2's work schedule (src/attn2/schedule.cuh) on the host: for every
// deployment the kernel serves and every length, each visible key is taken
// by exactly one warpgroup (wgmma path) or CTA (mma.sync path), and every CTA
// of a cluster agrees on what the cluster does.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "attn2/schedule.cuh"
#include "muse_decode/attn2.h"

namespace md = muse_decode;
namespace at = muse_decode::attn2_impl;

namespace {

struct Launch {
  int kvh, reqs, mml, window;
  bool idle_last;  // the host's decision for a grid that fills the GPU exactly
};

// Lengths to try for max_model_len mml: every one up to 300, then odd and
// boundary values (pages, tiles, slice steps) up to mml.
std::vector<int> lengths(int mml) {
  std::set<int> ls;
  for (int l = 8; l <= std::min(mml, 300); ++l) ls.insert(l);
  for (int base : {511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 2055, 2056, 4095, 4096, 4097, 8191, 8192, 8193,
                   16383, 16385, 32767, 32768, 32769, 65536, 131071, 131072})
    if (base <= mml) ls.insert(base);
  for (int l = 301; l <= mml; l = l * 5 / 4 + 7) ls.insert(l);
  ls.insert(mml);
  return {ls.begin(), ls.end()};
}

template <int kCluster, bool kOneSlice, bool kWindow>
void check_tiles(const Launch& launch, int len) {
  const int splits = kOneSlice ? 1 : md::attn2_splits(launch.mml, launch.window, launch.kvh);
  const at::Deployment d{splits, launch.kvh, launch.reqs, launch.idle_last, launch.reqs == 1};
  const at::KeyRange k = at::key_range(len, launch.window, launch.mml);
  SCOPED_TRACE(::testing::Message() << "C " << kCluster << " kvh " << launch.kvh << " reqs " << launch.reqs << " mml "
                                    << launch.mml << " window " << launch.window << " L " << len);
  for (int req = 0; req < launch.reqs; ++req) {
    // (KV head) -> tile -> takers; cluster (x, y) -> its (slice, head)
    std::map<int, std::map<int, int>> taken;
    std::map<int, std::set<int>> piece_rows;  // (KV head) -> 8-key rows of the odd tile taken in pieces
    std::set<std::pair<int, int>> slice_heads;
    for (int y = 0; y < launch.kvh; ++y)
      for (int split = 0; split < splits; ++split) {
        std::set<std::tuple<int, int, bool, int>> cluster_view;  // what every CTA of the cluster decided
        for (int rank = 0; rank < kCluster; ++rank)
          for (int half = 0; half < 2; ++half) {
            const at::TileSchedule s = at::tile_schedule<kCluster, kOneSlice, kWindow>(d, k, split, y, rank, half, req);
            cluster_view.insert({s.split, s.kv_head, s.leaves(), s.active});
            if (rank == 0 && half == 0) {
              EXPECT_TRUE(slice_heads.insert({s.split, s.kv_head}).second);
            }
            ASSERT_GE(s.my_tiles, 0);
            if (s.leaves()) {
              continue;
            }
            if (s.early_push) {
              EXPECT_LE(s.my_tiles, at::kWgStages - 1) << "early push needs the last stage free";
            }
            for (int j = 0; j < s.my_tiles; ++j) {
              const int t = s.tile(j);
              if (s.tail && j == 1) {  // a piece of the odd tile: 8 keys
                ASSERT_TRUE(s.has_piece);
                EXPECT_TRUE(piece_rows[s.kv_head].insert(s.piece_at).second) << "piece taken twice";
                continue;
              }
              ASSERT_GE(t, 0);
              ASSERT_LT(t, s.num_tiles);
              taken[s.kv_head][t] += 1;
              // Its pages lie in the table's range of visible pages (the odd tile's first slots may lie below).
              EXPECT_LE(s.first_page_of(j), k.last_page);
              EXPECT_GE(s.first_page_of(j) + at::kTilePages - 1, k.first_page);
            }
          }
        EXPECT_EQ(cluster_view.size(), 1u) << "the CTAs of cluster (" << split << ", " << y << ") disagree";
      }
    EXPECT_EQ(slice_heads.size(), static_cast<size_t>(splits * launch.kvh)) << "the interleave is not a bijection";
    if (k.broken) continue;
    const int pages = k.last_page - k.first_page + 1;
    const int num_tiles = (pages + at::kTilePages - 1) / at::kTilePages;
    for (int h = 0; h < launch.kvh; ++h) {
      const bool pieces = !piece_rows[h].empty();
      for (int t = 0; t < num_tiles; ++t) {
        if (pieces && t == 0) {
          EXPECT_EQ(taken[h].count(0), 0u) << "the odd tile goes in pieces only";
          continue;
        }
        EXPECT_EQ(taken[h][t], 1) << "head " << h << " tile " << t << " of " << num_tiles;
      }
      EXPECT_LE(taken[h].size(), static_cast<size_t>(num_tiles));
      if (pieces) {
        // The odd tile's 8-key rows that hold a visible key, each in one piece.
        const at::TileSchedule s = at::tile_schedule<kCluster, kOneSlice, kWindow>(d, k, 0, h, 0, 1, req);
        std::set<int> need;
        for (int row = 0; row < 2 * at::kTilePages; ++row) {
          const int key0 = s.tile_page0 * md::kPageSize + row * 8;
          if (key0 + 7 >= k.lo && key0 < (s.tile_page0 + at::kTilePages) * md::kPageSize &&
              key0 >= k.first_page * md::kPageSize)
            need.insert(row);
        }
        EXPECT_EQ(piece_rows[h], need);
      }
    }
  }
}

template <int kCluster, bool kOneSlice>
void check_groups(const Launch& launch, int len) {
  const int splits = kOneSlice ? 1 : md::attn2_splits(launch.mml, launch.window, launch.kvh);
  const at::Deployment d{splits, launch.kvh, launch.reqs, launch.idle_last, launch.reqs == 1};
  const at::KeyRange k = at::key_range(len, launch.window, launch.mml);
  SCOPED_TRACE(::testing::Message() << "mma.sync C " << kCluster << " kvh " << launch.kvh << " mml " << launch.mml
                                    << " L " << len);
  for (int req = 0; req < launch.reqs; ++req)
    for (int h = 0; h < launch.kvh; ++h) {
      std::map<int, int> taken;
      for (int split = 0; split < splits; ++split)
        for (int rank = 0; rank < kCluster; ++rank) {
          const at::GroupSchedule g = at::group_schedule<kCluster, kOneSlice>(d, k, split, h, rank, req);
          if (g.leaves) continue;
          for (int j = 0; j < g.my_groups; ++j) taken[g.group(j)] += 1;
        }
      if (k.broken) {
        EXPECT_TRUE(taken.empty());
        continue;
      }
      const int groups = (k.last_page - k.first_page + at::kGroupPages) / at::kGroupPages;
      ASSERT_EQ(taken.size(), static_cast<size_t>(groups));
      for (const auto& [g, n] : taken) {
        EXPECT_LT(g, groups);
        EXPECT_EQ(n, 1) << "group " << g;
      }
    }
}

}  // namespace

TEST(Attn2Schedule, KeyRange) {
  const at::KeyRange k = at::key_range(8, 0, 2048);
  EXPECT_FALSE(k.broken);
  EXPECT_EQ(k.lo, 0);
  EXPECT_EQ(k.last_page, 0);
  const at::KeyRange w = at::key_range(10000, 2048, 131072);
  EXPECT_EQ(w.lo, 10000 - 7 - 2048);  // row 0 (position L - 8) sees keys from L - 8 - 2047
  EXPECT_EQ(w.first_page, w.lo / 16);
  EXPECT_EQ(w.first_new_page, (10000 - 8) / 16);
  EXPECT_TRUE(at::key_range(7, 0, 2048).broken);
  EXPECT_TRUE(at::key_range(2049, 0, 2048).broken);
}

// The TP8 deployments (2 KV heads, clusters of 16): one slice at
// max_model_len 2048 and under the 2048-key window, seven slices at 128k,
// with and without the grid's last cluster placed late.
TEST(Attn2Schedule, Tp8EveryKeyOnce) {
  for (int len : lengths(2048)) check_tiles<16, true, false>({2, 1, 2048, 0, false}, len);
  for (int len : lengths(131072)) check_tiles<16, true, true>({2, 1, 131072, 2048, false}, len);
  for (bool idle_last : {false, true})
    for (int len : lengths(131072)) check_tiles<16, false, true>({2, 1, 131072, 0, idle_last}, len);
  for (int len : lengths(32768)) check_tiles<16, false, true>({2, 1, 32768, 0, true}, len);
}

// Clusters of 8 (GPUs that cannot place 16; TP4 and TP1), several requests.
TEST(Attn2Schedule, ClustersOf8EveryKeyOnce) {
  for (int len : lengths(2048)) check_tiles<8, true, false>({2, 3, 2048, 0, false}, len);
  for (int len : lengths(32768)) check_tiles<8, false, true>({4, 1, 32768, 0, true}, len);
  for (int len : lengths(32768)) check_tiles<8, false, true>({16, 2, 32768, 0, false}, len);
  for (int len : {8, 100, 2055, 4097, 20000}) check_tiles<8, true, true>({16, 2, 32768, 2048, false}, len);
}

TEST(Attn2Schedule, MmaSyncGroupsEveryKeyOnce) {
  for (int len : lengths(2048)) check_groups<16, true>({2, 1, 2048, 0, false}, len);
  for (bool idle_last : {false, true})
    for (int len : lengths(131072)) check_groups<16, false>({2, 1, 131072, 0, idle_last}, len);
  for (int len : lengths(32768)) check_groups<8, false>({16, 2, 32768, 0, false}, len);
}

// The window layer's odd tile: 2055 keys = 32 whole tiles and 1-2 pages
// that go in 8-key pieces to the second warpgroups of the first CTAs.
TEST(Attn2Schedule, WindowOddTileGoesInPieces) {
  const at::Deployment d{1, 2, 1, false, true};
  int with_pieces = 0;
  for (int len = 2100; len < 2100 + 64; ++len) {
    const at::KeyRange k = at::key_range(len, 2048, 131072);
    const at::TileSchedule s = at::tile_schedule<16, true, true>(d, k, 0, 0, 0, 1, 0);
    if (s.tail) {
      ++with_pieces;
      EXPECT_EQ(s.num_tiles, s.wgs + 1);
      EXPECT_LE(s.head_pages, at::kTailPages);
    }
  }
  EXPECT_GT(with_pieces, 0);
}
