// attention_block's kernel: one layer's qkv_front, attn2 and o_proj in one
// cooperative launch of one CTA per SM (docs/contract.md), composed of its
// phases:
//   config.cuh       threads, the shared-memory plan, the counters
//   front.cuh        qkv_front's stream-K loop over fixed shares
//   attention.cuh    attn2's key loop over fixed slices, the slices' merge
//   projection.cuh   o_proj's columns from a weight held in shared memory
// and the host side of the launch: the tensor maps, the attributes and the
// co-residency check.
//
// What streams when (TP8, one request): the front's 37.7 MB weight through a
// ring of 20 stages; as a CTA's front ends, o_proj's 127 KB share of its
// weight and the slice's first groups of older keys, so both stream under the
// front's tail and the wait for the heads; the remaining keys after the
// heads; then only x (o_proj's input) after the merge.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tensor_map.h"
#include "../common/trace.cuh"
#include "attention.cuh"
#include "config.cuh"
#include "front.cuh"
#include "muse_decode/o_proj.h"
#include "params.h"
#include "projection.cuh"

namespace muse_decode::attention_block_impl {

MUSE_DECODE_TRACE_RING(attention_block_trace)
static_assert(static_cast<int>(Phase::kExit) < trace::kStampWords, "every phase has a stamp word");

namespace {

struct Maps {
  CUtensorMap qkv_w, x8, x16, o_w, o_x;
};

__global__ void __launch_bounds__(kThreads, 1) attention_block_kernel(const __grid_constant__ Maps maps, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + swizzle::kAtomBytes - 1) &
                                             ~uintptr_t{swizzle::kAtomBytes - 1});
  __shared__ uint64_t front_bars[2 * kFrontStages + 1];
  __shared__ uint64_t key_bars[2 * kKeyStages];
  __shared__ uint64_t w_bars[2 * kWStages];
  __shared__ uint64_t x_bars[2];
  __shared__ int s_last, s_bad;
  __shared__ float4 s_states[kThreads];
  trace::Recorder<Phase> trace(attention_block_trace());
  trace.tag(gridDim.x);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  uint32_t* const counter_part = reinterpret_cast<uint32_t*>(ws + p.ws.counters);
  const uint32_t epoch = __ldcg(counter_part + Counters::kEpoch);
  uint32_t* counters = counter_part + Counters::kSets + (epoch & 1) * Counters::kSetWords;
  if (blockIdx.x == 0) {  // the next launch's set
    uint32_t* next = counter_part + Counters::kSets + ((epoch + 1) & 1) * Counters::kSetWords;
    for (int i = threadIdx.x; i < Counters::kSetWords; i += kThreads) next[i] = 0u;
  }
  const uint32_t base = ptx::smem_addr(smem);
  const FrontRing front_ring{base, front_bars, front_bars + kFrontStages};
  const KeyRing key_ring{base + kKeyRingOffset, key_bars, key_bars + kKeyStages};
  const WRing w_ring{base, w_bars, w_bars + kWStages};
  const XRing x_ring{base + kXOffset, x_bars, x_bars + 1};
  if (threadIdx.x == 0) {
    front_ring.init(kMmaWarps);
    ptx::mbar_init(&front_bars[2 * kFrontStages], 1);
    key_ring.init(kWarps);
    w_ring.init(kMmaWarps);
    x_ring.init(kMmaWarps);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // ---- the front ----
  const qkv_front_impl::EpilogueSmem epi{reinterpret_cast<float*>(smem + kEpiYOffset),
                                         reinterpret_cast<float*>(smem + kEpiRopeOffset),
                                         reinterpret_cast<int64_t*>(smem + kEpiSlotOffset),
                                         &front_bars[2 * kFrontStages]};
  if (warp == kCopyWarp) {
    if (lane == 0) produce_front(front_ring, {&maps.qkv_w, &maps.x8, &maps.x16}, p);
  } else if (warp == kStagingWarp) {
    qkv_front_impl::stage_epilogue_inputs(front_params(p, 0, ws + p.ws.qkv, ws + p.ws.front), epi, lane);
  } else if (warp < kMmaWarps) {
    pipeline::Position<kFrontStages> at;
    uint8_t* front_ws = ws + p.ws.front;
    void* qkv = ws + p.ws.qkv;
    for (int g = 0; g < num_groups(p); ++g, front_ws += p.ws.front_group_bytes) {
      if (group_tokens(p, g) <= 8)
        consume_front_group<1>(front_ring, at, epi, &s_last, p, g, qkv, front_ws, counters, warp, lane, trace);
      else
        consume_front_group<2>(front_ring, at, epi, &s_last, p, g, qkv, front_ws, counters, warp, lane, trace);
    }
  }
  __syncthreads();  // the front's ring and epilogue area are free
  trace.mark(Phase::kFrontDone);

  // o_proj's weight, the first fills of its ring: it depends on nothing, so
  // it copies as the CTA's front ends, right after the first slice's older
  // keys (warp 0 lane 0; a CTA without a slice copies it here).
  const int w_total = w_fills(p);
  const int w_early = w_total < kWStages ? w_total : kWStages;
  bool w_copied = false;
  const auto copy_weight = [&] {
    if (!w_copied && lane == 0) {
      ptx::fence_proxy_async_smem();
      ptx::prefetch_tensor_map(&maps.o_w);
      produce_weight(w_ring, &maps.o_w, p, 0, w_early);
    }
    w_copied = true;
  };

  // ---- the attention: every share's slice, then every share's rows ----
  int key_fills = 0;
  for (int share = blockIdx.x; share < kShares; share += gridDim.x) {
    const SliceOf s = SliceOf::of(p, share);
    if (s.valid) attend_slice(p, s, smem, key_ring, &s_bad, counters, key_fills, warp, lane, trace, copy_weight);
  }
  if (warp == 0) copy_weight();
  for (int share = blockIdx.x; share < kShares; share += gridDim.x) {
    const SliceOf s = SliceOf::of(p, share);
    if (s.valid) merge_rows(p, s, s_states, counters, warp, lane, trace);
  }
  __syncthreads();  // the key stages are free for x
  trace.mark(Phase::kMerged);

  // ---- o_proj ----
  if (warp == kCopyWarp) {
    if (lane == 0) {
      ptx::fence_proxy_async_smem();
      ptx::prefetch_tensor_map(&maps.o_x);
      // x per (share, group), and the weight's later fills (TP4, or several
      // groups or shares) as the ring frees.
      int x_fill = 0, w_next = w_early;
      const int per_group = w_blocks(p);
      for (int share = blockIdx.x; share < kOutTiles; share += gridDim.x)
        for (int g = 0; g < num_groups(p); ++g) {
          produce_x(x_ring, base + kXOffset, &maps.o_x, p, counters, g, x_fill++);
          const int upto = w_next + per_group < w_total ? w_next + per_group : w_total;
          produce_weight(w_ring, &maps.o_w, p, w_next, upto);
          w_next = upto;
        }
    }
  } else if (warp < kMmaWarps) {
    pipeline::Position<kWStages> w_at;
    int x_fill = 0;
    for (int share = blockIdx.x; share < kOutTiles; share += gridDim.x)
      for (int g = 0; g < num_groups(p); ++g, ++x_fill) {
        if (group_tokens(p, g) <= 8)
          project_group<1>(w_ring, w_at, x_ring, x_fill, base + kXOffset, p, share, g, warp, lane, trace);
        else
          project_group<2>(w_ring, w_at, x_ring, x_fill, base + kXOffset, p, share, g, warp, lane, trace);
      }
  }

  // ---- out: CTA 0 advances the epoch for the next launch ----
  __syncthreads();
  trace.mark(Phase::kExit);
  if (blockIdx.x == 0 && threadIdx.x == 0) __stcg(counter_part + Counters::kEpoch, epoch + 1u);
}

// The tensor maps of a launch, from this thread's table (src/common/tensor_map.h).
struct MapSite {};
bool make_maps(const Params& p, Maps* m) {
  const int T = p.num_reqs * kVerifyLen;
  const int n = qkv_width(p.num_kv_heads), k = o_proj_in_width(p.num_kv_heads);
  const void* attn_out = static_cast<const uint8_t*>(p.workspace) + p.ws.attn_out;
  return tma::cached<MapSite, 8>(&m->qkv_w, tma::bf16_rows(p.qkv_weight, n, kHiddenSize, kHiddenSize, 64)) &&
         tma::cached<MapSite, 8>(&m->x8, tma::bf16_rows(p.x, T, kHiddenSize, p.x_stride, 8)) &&
         tma::cached<MapSite, 8>(&m->x16, tma::bf16_rows(p.x, T, kHiddenSize, p.x_stride, kTokenGroup)) &&
         tma::cached<MapSite, 8>(&m->o_w, tma::bf16_rows(p.o_weight, kHiddenSize, k, k, kOutTileCols)) &&
         tma::cached<MapSite, 8>(&m->o_x, tma::bf16_rows(attn_out, T, k, k, kTokenGroup));
}

}  // namespace

int launch(const Params& p, Stream stream) {
  if (p.grid < 1 || p.grid > kShares || p.workspace == nullptr) return cudaErrorInvalidValue;
  Maps maps;
  if (!make_maps(p, &maps)) return cudaErrorInvalidValue;
  detail::LaunchShape shape{dim3(p.grid), dim3(kThreads), static_cast<unsigned>(kSmemBytes), 0, false};
  shape.cooperative = true;
  return detail::launch_kernel<attention_block_kernel>(shape, reinterpret_cast<cudaStream_t>(stream), maps, p);
}

int set_kernel_attributes(int* grid) {
  *grid = 0;
  if (!tma::encoder_available()) return static_cast<int>(cudaErrorNotSupported);
  cudaError_t err = detail::set_smem_limit<attention_block_kernel>(kSmemBytes);
  if (err != cudaSuccess) return static_cast<int>(err);
  int device = 0, sms = 0, per_sm = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_block_kernel, kThreads, kSmemBytes);
  if (err != cudaSuccess) return static_cast<int>(err);
  *grid = per_sm >= 1 ? (sms < kShares ? sms : kShares) : 0;
  return 0;
}

}  // namespace muse_decode::attention_block_impl
