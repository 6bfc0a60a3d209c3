// o_proj's kernels: out = bf16(x W^T) for 1..64 rows (docs/contract.md). One
// source serves sm_90a and sm_100a (TMA, mbarrier, mma.sync, PDL).
//
// The cost is reading the weight once (TP8: 16.8 MB, 4.0 us at 4.2 TB/s);
// the math is 1.1 GFLOP at T = 64, so everything is arranged around the
// stream of weight bytes: one producer thread per CTA keeps the CTA's weight
// rows in flight and another brings x after griddepcontrol.wait
// (pipeline.cuh), 4 consumer warps multiply them (mainloop.cuh), and the
// k-groups' sums are added in a fixed order and stored (epilogue.cuh). The shapes and the
// shared-memory plan: config.cuh; the kernel and its launch: kernel.cuh.
#include <cuda_runtime.h>

#include "config.cuh"
#include "kernel.cuh"
#include "params.h"

namespace muse_decode::o_proj_impl {
namespace {

// The tunings of the dispatch table, by K class and n-tile count (T <= 8,
// 16, 32, 64). Every one has 64 output columns per CTA: 128 CTAs (32 columns,
// 256 CTAs, took TP8 T = 1 5.9-6.3 us against 5.3-5.5). docs/o_proj.md has
// the table of designs measured and set aside.
//
// Short K (512, 1024: TP16, TP8): two CTAs per SM, so that the next launch's
// CTAs are resident while this one runs and stream their weight before their
// griddepcontrol.wait. Up to T = 16 the consumers also hold the first 8
// blocks in registers before x exists, so the whole 128 KB share leaves
// before the wait (TP8 T = 1 / 8 / 16: 4.34 / 5.12 / 5.26 us against 5.26 /
// 5.40 / 5.62 without); from T = 17 the accumulators need those registers,
// and 6 weight stages leave the x ring its 16.
//
// From T = 4 to 16, x's 8 or 16 rows are read by clusters of 4 CTAs, each
// block once per cluster and multicast into its 4 CTAs: read by each of the
// 128 CTAs, x's lines cost T = 8 0.8 us over T = 1 (5.10 against 4.30; with x
// read as one row, 4.30), as the next call's resident CTAs stream their
// weight through the same SMs; with clusters of 4, T = 8 / 16 take 4.75 /
// 4.90 against 5.08 / 5.27. A clustered launch costs T = 1 0.35 us (4.65),
// where x is one row, so T < 4 (x of at most 3 rows) runs without them.
struct ShortKHeld {
  static constexpr int kRowTiles = 4, kCtasPerSm = 2, kWStages = 8, kMTilesPerWarp = 2, kHeldBlocks = 8;
  static constexpr int kXCluster = 1;
  static constexpr bool kWgmma = false;
};
struct ShortKHeldSharedX : ShortKHeld {
  static constexpr int kXCluster = 4;
};
constexpr int kSharedXTokens = 4;  // from T = 4, the clustered configuration
// From T = 17, x's 32 rows over clusters of 4 took T = 32 6.76 us against
// 6.12 without.
struct ShortK {
  static constexpr int kRowTiles = 4, kCtasPerSm = 2, kWStages = 6, kMTilesPerWarp = 2, kHeldBlocks = 0;
  static constexpr int kXCluster = 1;
  static constexpr bool kWgmma = false;
};
// At T = 33..64 the consumers' MMAs show: on sm_90a they take wgmma, one
// m64n64k16 per k-step from the stages (TP8 T = 64 6.92 us against 7.48 with
// mma.sync; at T = 17..32 mma.sync stays, 6.11 against 6.48).
struct ShortKWgmma : ShortK {
  static constexpr bool kWgmma = true;
};
// Long K (2048 to 8192, TP4 to TP1: 32-128 blocks): one CTA per SM with 16
// blocks in the ring; the stream dominates, and a co-resident next launch
// only competes with it (TP1 T = 64 38.1 us against 44.6 with short K's).
struct LongK {
  static constexpr int kRowTiles = 4, kCtasPerSm = 1, kWStages = 16, kMTilesPerWarp = 2, kHeldBlocks = 0;
  static constexpr int kXCluster = 1;
  static constexpr bool kWgmma = false;
};
struct LongKWgmma : LongK {
  static constexpr bool kWgmma = true;
};

using ShortNt1 = Config<ShortKHeld, 1>;
using ShortNt1SharedX = Config<ShortKHeldSharedX, 1>;
using ShortNt2 = Config<ShortKHeldSharedX, 2>;
using ShortNt4 = Config<ShortK, 4>;
using ShortNt8 = Config<ShortKWgmma, 8>;
using LongNt1 = Config<LongK, 1>;
using LongNt2 = Config<LongK, 2>;
using LongNt4 = Config<LongK, 4>;
using LongNt8 = Config<LongKWgmma, 8>;
constexpr int kLongK = 2048;

}  // namespace

int set_kernel_attributes() {
  if (!tma::encoder_available()) return static_cast<int>(cudaErrorNotSupported);
  cudaError_t err = cudaSuccess;
  for (const cudaError_t e : {set_smem_limit<ShortNt1>(), set_smem_limit<ShortNt1SharedX>(),
                              set_smem_limit<ShortNt2>(), set_smem_limit<ShortNt4>(),
                              set_smem_limit<ShortNt8>(), set_smem_limit<LongNt1>(), set_smem_limit<LongNt2>(),
                              set_smem_limit<LongNt4>(), set_smem_limit<LongNt8>()})
    if (err == cudaSuccess) err = e;
  return static_cast<int>(err);
}

int launch(const Params& p, Stream stream) {
  // The table has no kernel for other token counts or widths.
  if (p.num_tokens < 1 || p.num_tokens > kOProjMaxTokens || !o_proj_supports_in_width(p.in_width))
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  // Flat dispatch on (K class, n-tile count); short K's one n-tile by
  // whether x is shared over clusters.
  const bool long_k = p.in_width >= kLongK;
  cudaError_t err;
  switch (n_tiles_for(p.num_tokens) * (long_k ? -1 : 1)) {
    case 1:
      err = p.num_tokens < kSharedXTokens ? launch_config<ShortNt1>(p, s) : launch_config<ShortNt1SharedX>(p, s);
      break;
    case 2: err = launch_config<ShortNt2>(p, s); break;
    case 4: err = launch_config<ShortNt4>(p, s); break;
    case 8: err = launch_config<ShortNt8>(p, s); break;
    case -1: err = launch_config<LongNt1>(p, s); break;
    case -2: err = launch_config<LongNt2>(p, s); break;
    case -4: err = launch_config<LongNt4>(p, s); break;
    default: err = launch_config<LongNt8>(p, s); break;
  }
  return static_cast<int>(err);
}

}  // namespace muse_decode::o_proj_impl
