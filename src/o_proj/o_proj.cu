// o_proj's kernels: out = bf16(x W^T) for 1..64 rows (SPEC section 10). One
// source serves sm_90a and sm_100a (TMA, mbarrier, mma.sync, PDL).
//
// The cost is reading the weight once (TP8: 16.8 MB, 4.0 us at 4.2 TB/s);
// the math is 1.1 GFLOP at T = 64, so everything is arranged around the
// stream of weight bytes: a producer thread per CTA keeps the CTA's weight
// rows in flight (pipeline.cuh), 4 consumer warps multiply them by x as x
// streams in after griddepcontrol.wait (mainloop.cuh), and the k-groups' sums
// are added in a fixed order and stored (epilogue.cuh). The shapes and the
// shared-memory plan: config.cuh; the kernel and its launch: kernel.cuh.
#include <cuda_runtime.h>

#include "config.cuh"
#include "kernel.cuh"
#include "o_proj_kernels.h"

namespace muse_decode::oproj {
namespace {

// The configuration of each n-tile count (T <= 8, 16, 32, 64). 32 output
// columns per CTA (256 CTAs): the CTA's whole TP8 weight share (16 blocks of
// 4 KB, 64 KB) sits in shared memory, so every weight copy leaves before
// griddepcontrol.wait, and at one or two n-tiles three CTAs fit per SM: the
// 256 CTAs of one launch take two per SM and leave a third slot on every SM
// to the next launch, which streams its share while this one finishes. With
// four or eight n-tiles the x boxes (4-8 KB each) need the room of two CTAs
// per SM.
using ConfigNt1 = Config<2, 1, 3, 16>;
using ConfigNt2 = Config<2, 2, 3, 16>;
using ConfigNt4 = Config<2, 4, 2, 16>;
using ConfigNt8 = Config<2, 8, 2, 16>;

}  // namespace
}  // namespace muse_decode::oproj

namespace muse_decode::detail {

int o_proj_set_kernel_attributes() {
  using namespace oproj;
  if (!encode_tiled_fn()) return static_cast<int>(cudaErrorNotSupported);
  cudaError_t err = set_smem_limit<ConfigNt1>();
  if (err == cudaSuccess) err = set_smem_limit<ConfigNt2>();
  if (err == cudaSuccess) err = set_smem_limit<ConfigNt4>();
  if (err == cudaSuccess) err = set_smem_limit<ConfigNt8>();
  return static_cast<int>(err);
}

int o_proj_launch(const OProjParams& p, Stream stream) {
  using namespace oproj;
  // The table has no kernel for other token counts or widths.
  if (p.num_tokens < 1 || p.num_tokens > kOProjMaxTokens || !o_proj_supports_in_width(p.in_width))
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  // Flat dispatch on the n-tile count.
  cudaError_t err;
  switch (n_tiles_for(p.num_tokens)) {
    case 1: err = launch_config<ConfigNt1>(p, s); break;
    case 2: err = launch_config<ConfigNt2>(p, s); break;
    case 4: err = launch_config<ConfigNt4>(p, s); break;
    default: err = launch_config<ConfigNt8>(p, s); break;
  }
  return static_cast<int>(err);
}

}  // namespace muse_decode::detail
