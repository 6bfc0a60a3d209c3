// The epilogue of a CTA once its blocks are consumed: the k-groups' sums of
// each m-tile added in group order (fixed, so the bits are too), rounded once
// to bf16 into a token-major tile in shared memory, then written to out with
// 16-byte stores, rows t < T only. The drained rings hold both.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"
#include "mainloop.cuh"
#include "pipeline.cuh"

namespace muse_decode::o_proj_impl {

// The consumer threads (all 128 come here) with this warp's sums in acc.
// `smem`: the CTA's shared memory, every block consumed and no copy in flight.
template <typename Cfg>
__device__ __forceinline__ void store_tile(WarpSums<Cfg>& acc, uint8_t* smem, int row0, const Params& p,
                                          int warp, int lane) {
  const int row_group = warp % Cfg::kRowGroups, k_group = warp / Cfg::kRowGroups;
  const int first_m_tile = row_group * Cfg::kMTilesPerWarp;
  float4* partials = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);
  __nv_bfloat16* tile = reinterpret_cast<__nv_bfloat16*>(smem + Cfg::kOutTileOffset);
  constexpr int kPartialFloat4 = Cfg::kPartialBytes / 16;

  sync_consumers();  // every warp is past its last block: the rings are free
  if constexpr (Cfg::kKGroups > 1) {
    if (k_group > 0) {
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt) {
        float4* mine = partials + ((k_group - 1) * Cfg::kRowTiles + first_m_tile + mt) * kPartialFloat4;
#pragma unroll
        for (int nt = 0; nt < Cfg::NT; ++nt)
          mine[nt * 32 + lane] = make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
      }
    }
    sync_consumers();
    if (k_group == 0) {
#pragma unroll
      for (int g = 1; g < Cfg::kKGroups; ++g)
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt) {
          const float4* theirs = partials + ((g - 1) * Cfg::kRowTiles + first_m_tile + mt) * kPartialFloat4;
#pragma unroll
          for (int nt = 0; nt < Cfg::NT; ++nt) {
            const float4 v = theirs[nt * 32 + lane];
            acc[mt][nt][0] += v.x;
            acc[mt][nt][1] += v.y;
            acc[mt][nt][2] += v.z;
            acc[mt][nt][3] += v.w;
          }
        }
    }
  }
  // The accumulator layout of mma m16n8: rows g and g + 8 of the m-tile,
  // tokens 2q and 2q + 1 of each n-tile (g = lane / 4, q = lane % 4).
  if (k_group == 0) {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTilesPerWarp; ++mt) {
      const int col = (first_m_tile + mt) * 16 + g;
#pragma unroll
      for (int nt = 0; nt < Cfg::NT; ++nt) {
        const int tok = nt * 8 + q * 2;
        tile[tok * Cfg::kRows + col] = __float2bfloat16_rn(acc[mt][nt][0]);
        tile[(tok + 1) * Cfg::kRows + col] = __float2bfloat16_rn(acc[mt][nt][1]);
        tile[tok * Cfg::kRows + col + 8] = __float2bfloat16_rn(acc[mt][nt][2]);
        tile[(tok + 1) * Cfg::kRows + col + 8] = __float2bfloat16_rn(acc[mt][nt][3]);
      }
    }
  }
  sync_consumers();
  // out[t, row0 .. row0 + kRows): kRows / 8 chunks of 16 bytes per token.
  constexpr int kChunksPerToken = Cfg::kRows / 8;
  const int chunks = p.num_tokens * kChunksPerToken;
  ptx::griddep_wait();  // the kernel before may still read or write out until it completes
  for (int i = warp * 32 + lane; i < chunks; i += kConsumerThreads) {
    const int t = i / kChunksPerToken, c = i % kChunksPerToken;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + t * Cfg::kRows + c * 8);
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) + t * p.out_stride + row0 + c * 8;
    *reinterpret_cast<uint4*>(dst) = v;
  }
}

}  // namespace muse_decode::o_proj_impl
