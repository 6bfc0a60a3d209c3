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

// The configuration of each n-tile count (T <= 8, 16, 32, 64) and K. Every
// one has 64 output columns per CTA (128 CTAs, 4 SMs of an H200 idle): 32
// columns (256 CTAs) and 16 (512) ran slower (H200, TP8, T = 1, PDL: 5.9-6.3
// and 10.2 us against 5.3-5.5).
//
// Short K (512 and 1024, TP16 and TP8: 8-16 blocks; measured at TP8): two
// CTAs per SM, so that the next launch's CTAs are resident while this one
// runs and stream their weight before their griddepcontrol.wait. Up to
// T = 16 the consumers also hold the first 8 blocks in registers before x
// exists, so the ring takes blocks 8-15 early too and the whole 128 KB share
// leaves before the wait: 4.34 / 5.12 / 5.26 us at T = 1 / 8 / 16 against
// 5.26 / 5.40 / 5.62 without (H200, TP8, PDL, bench_o_proj's method, one
// run); from T = 17 the accumulators need those registers. Without held
// blocks (one run, us at T = 1 / 8 / 16 / 32 / 64): 8 blocks of the 16 in the
// ring and two m-tiles per warp 5.26 / 5.32 / 5.54 / 6.50 / 7.52; 6 blocks (a
// deeper x ring) 5.64 / 5.68 / 5.73 / 6.39 / 7.39; 12 blocks 5.47 / 5.66 /
// 5.86 / 7.18 / 8.47 (one m-tile per warp 5.42 / 5.66 / 6.14 / 7.25 / 9.72);
// the whole 128 KB share with one CTA per SM 6.02 / 6.06 / 6.46 / 7.29 / 8.78
// (the next launch's CTAs find no room until this one's leave).
using ShortNt1 = Config<4, 1, 2, 8, 2, 8>;
using ShortNt2 = Config<4, 2, 2, 8, 2, 8>;
// At T = 33..64 the consumers' work shows (each warp's MMAs grow with T, and
// mma.sync reads x's fragments through ldmatrix for every m-tile pair): on
// sm_90a these take wgmma, one m64n64k16 per k-step from the stages
// (mainloop.cuh). H200, PDL, one run, us at T = 32 / 64: TP8 mma.sync 6.11 /
// 7.48, wgmma 6.48 / 6.92; TP1 32.93 / 36.51 against 33.62 / 35.69. At
// T = 17..32 mma.sync, measured faster there, stays.
using ShortNt4 = Config<4, 4, 2, 6, 2>;
using ShortNt8 = Config<4, 8, 2, 6, 2, 0, true>;
// Long K (2048 to 8192, TP4 to TP1: 32-128 blocks): one CTA per SM with 16
// blocks in the ring. The stream dominates, and a co-resident next launch
// only competes with it. H200, PDL, us at T = 1 / 8 / 16 / 32 / 64: TP1 31.2
// / 31.5 / 32.0 / 33.2 / 38.1, against 32.7 / 32.7 / 33.6 / 36.1 / 44.6 with
// the short-K configuration; TP4 9.0 / 9.0 / 9.6 / 10.7 / 13.2 against 9.7 /
// 9.8 / 10.2 / 10.8 / 13.2. One m-tile per warp: TP1 T = 64 39.1.
using LongNt1 = Config<4, 1, 1, 16, 2>;
using LongNt2 = Config<4, 2, 1, 16, 2>;
using LongNt4 = Config<4, 4, 1, 16, 2>;
using LongNt8 = Config<4, 8, 1, 16, 2, 0, true>;
constexpr int kLongK = 2048;

}  // namespace

int set_kernel_attributes() {
  if (!detail::encode_tiled_fn()) return static_cast<int>(cudaErrorNotSupported);
  cudaError_t err = cudaSuccess;
  for (const cudaError_t e : {set_smem_limit<ShortNt1>(), set_smem_limit<ShortNt2>(), set_smem_limit<ShortNt4>(),
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
  // Flat dispatch on (K class, n-tile count).
  const bool long_k = p.in_width >= kLongK;
  cudaError_t err;
  switch (n_tiles_for(p.num_tokens) * (long_k ? -1 : 1)) {
    case 1: err = launch_config<ShortNt1>(p, s); break;
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
