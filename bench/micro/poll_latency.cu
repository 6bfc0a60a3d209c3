// The latency of attn2's split-merge poll: how long the merging CTA takes to
// see the other slices' partial rows, quiet or beside DRAM streams.
//
// The merger reads the other slices' partial rows (ld.relaxed.gpu of words
// that mark themselves written: 0 = not yet) until all are there
// (docs/attn2.md, "Where the time goes": whether a poll's own latency, and the
// traffic beside it, explain the split merge's cost). One grid of two CTAs
// per SM, the merger block 0:
//   A  the words are all written before the launch: one poll's round trip (14
//      loads per thread in flight, 2 per slot, 128 threads, as attn2's merger
//      at 32k);
//   B  other CTAs store them now (st.relaxed.gpu, each after its own delay):
//      the time from the last producer's store to the poll that saw it all;
//   C  B with every other CTA streaming reads from DRAM meanwhile (as the next
//      call's early copies do), including the one sharing the poller's SM;
//   E  C without streaming on the poller's SM (is the wait in its own SM's
//      memory pipeline or in the L2 and the crossbar?);
//   F  C with the streams as bulk copies into shared memory (attn2's copies
//      are TMA), the poll by loads as before;
//   G  F with the poll itself one bulk copy per slot into shared memory,
//      completing on an mbarrier;
//   D  one load at a time (pointer chase over L2-resident lines): the bare
//      L2 round trip, for scale.
//
//   cmake --build build --target poll_latency && build/poll_latency
//
// One line per case and producer delay (ns; slot s stores after delay x
// (s + 1)): "1st poll", us from the start of polling to the first poll's
// return; "all seen - last", us from the last producer's store to the poll
// that saw every slot written; "polls", how many polls that took. Medians
// over 21 launches, from %globaltimer (32 ns steps). D prints us per load.
// The last line is the device's error state.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/ptx.cuh"

namespace ptx = muse_decode::ptx;

constexpr int kSlots = 7;     // slices whose rows the merger reads (attn2 at 32k: the 6 others + 1 spare)
constexpr int kRows = 4;      // rows a CTA of a cluster of 16 merges
constexpr int kWords = 66;    // m, l, then 64 columns (floats)
constexpr int kThreads = 256;

// Whether v holds in all 128 threads of named barrier 1 (the polling threads);
// kept here: the product never reduces a predicate over a named barrier.
__device__ __forceinline__ bool and_128(bool v) {
  uint32_t r;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 q, %1, 0;\n\tbar.red.and.pred p, 1, 128, q;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(v))
      : "memory");
  return r != 0;
}
// Kept here: the product's bulk copy (ptx::bulk_copy_g2s) takes an
// evict-first L2 policy; these copies carry no hint.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Kept here: a 4-byte relaxed load for the pointer chase (the product's
// handshakes load 8 or 16 bytes, ptx::ld_relaxed_gpu_v2 / _v4).
__device__ __forceinline__ uint32_t ld_relaxed_gpu_u32(const uint32_t* at) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}

// Block 0 polls; blocks 1..kSlots store one slot each (modes 1-5) after
// delay_ns * (slot + 1); the rest stream their share of `stream` (modes 2-5:
// C, E, F, G) or leave. out[0]: first poll's return - start of polling;
// stamps[0]: when the poll that saw all returned, stamps[1 + s]: slot s's
// store time; out[2]: polls. Modes: 0 A, 1 B, 2 C, 3 E, 4 F, 5 G.
__global__ void __launch_bounds__(kThreads) poll_kernel(uint32_t* ws, int mode, int delay_ns, const int4* stream,
                                                        long long stream_elems, unsigned* arrive,
                                                        unsigned long long* stamps, long long* out) {
  const int b = blockIdx.x, t = threadIdx.x;
  __shared__ __align__(128) uint8_t ring[8][4096];
  __shared__ __align__(8) uint64_t bars[8];
  if (t == 0)
    for (int k = 0; k < 8; ++k) ptx::mbar_init(ptx::smem_addr(&bars[k]), 1);
  ptx::fence_mbarrier_init();
  // Everyone launched before anything is timed.
  const unsigned smid = ptx::smid();
  if (t == 0) {
    if (b == 0) atomicExch(arrive + 1, smid + 1);
    atomicAdd(arrive, 1u);
    const unsigned long long t_in = ptx::globaltimer();
    while (atomicAdd(arrive, 0u) < gridDim.x) {
      if (ptx::globaltimer() - t_in > 200000000ull) __trap();  // 0.2 s: the grid is not all resident
    }
  }
  __syncthreads();
  const unsigned long long t0 = ptx::globaltimer();
  if (b == 0) {
    if (t >= 128) return;
    const int row = t / 32, d = (t % 32) * 2;
    int polls = 0;
    unsigned long long first = 0, done = 0;
    for (;;) {
      bool written = true;
      uint2 ml[kSlots], ov[kSlots];
      if (mode == 5) {  // G: one bulk copy per slot (its 4 rows, contiguous) into ring, on bars[0]
        const uint32_t bar = ptx::smem_addr(&bars[0]);
        if (t == 0) {
          ptx::mbar_arrive_expect_tx(bar, kSlots * kRows * kWords * 4);
          for (int s = 0; s < kSlots; ++s)
            bulk_load(ptx::smem_addr(ring[0]) + s * kRows * kWords * 4, ws + s * kRows * kWords, kRows * kWords * 4,
                      bar);
        }
        ptx::mbar_wait(bar, polls & 1);
        const uint32_t* sm = reinterpret_cast<const uint32_t*>(ring[0]);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const uint32_t* at = sm + (s * kRows + row) * kWords;
          ml[s] = make_uint2(at[0], at[1]);
          ov[s] = make_uint2(at[2 + d], at[3 + d]);
        }
        ptx::named_barrier_sync<1, 128>();  // the ring is refilled by the next poll
      } else {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const uint32_t* at = ws + (s * kRows + row) * kWords;
          ml[s] = ptx::ld_relaxed_gpu_v2(at);
          ov[s] = ptx::ld_relaxed_gpu_v2(at + 2 + d);
        }
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) written = written && ml[s].x && ml[s].y && ov[s].x && ov[s].y;
      // (G: one copy serves all 4 rows and thread 0 issues it, so the 4 warps
      // decide together: a warp leaving on its own row would leave the others
      // waiting on a copy never issued. With loads, each warp polls its own row.)
      const bool all = mode == 5 ? and_128(written) : __all_sync(0xFFFFFFFFu, written);
      const unsigned long long tp = ptx::globaltimer();
      if (polls++ == 0) first = tp;
      if (all) {
        done = tp;
        break;
      }
    }
    if (t == 0) {
      out[0] = static_cast<long long>(first - t0);
      stamps[0] = done;
      out[2] = polls;
    }
    return;
  }
  if (b <= kSlots) {
    if (mode == 0) return;  // A: written before the launch
    const int s = b - 1;
    while (ptx::globaltimer() - t0 < static_cast<unsigned long long>(delay_ns) * (s + 1)) {
    }
    if (t < 128) {
      const int row = t / 32, d = (t % 32) * 2;
      uint32_t* at = ws + (s * kRows + row) * kWords;
      if (d == 0) ptx::st_relaxed_gpu_v2(at, 1u, 1u);
      ptx::st_relaxed_gpu_v2(at + 2 + d, 1u, 1u);
    }
    __syncthreads();
    if (t == 0) stamps[1 + s] = ptx::globaltimer();
    return;
  }
  if (mode >= 4) {  // F, G: the others stream by bulk copies, 8 x 4 KB in flight
    const long long per = stream_elems * 16 / (gridDim.x - 1 - kSlots) / 4096;  // chunks
    const char* p = reinterpret_cast<const char*>(stream) + (b - 1 - kSlots) * per * 4096;
    if (t == 0) {
      for (long long i = 0; i < per; ++i) {
        const int k = static_cast<int>(i % 8);
        const uint32_t bar = ptx::smem_addr(&bars[k]);
        if (i >= 8) ptx::mbar_wait(bar, ((i - 8) / 8) & 1);
        ptx::mbar_arrive_expect_tx(bar, 4096);
        bulk_load(ptx::smem_addr(ring[k]), p + i * 4096, 4096, bar);
      }
      for (long long i = per > 8 ? per - 8 : 0; i < per; ++i)
        ptx::mbar_wait(ptx::smem_addr(&bars[i % 8]), (i / 8) & 1);
    }
    return;
  }
  if (mode == 2 || (mode == 3 && smid + 1 != atomicAdd(arrive + 1, 0u))) {  // C, E: the others stream from DRAM
    int4 acc = make_int4(0, 0, 0, 0);
    const long long per = stream_elems / (gridDim.x - 1 - kSlots);
    const int4* p = stream + (b - 1 - kSlots) * per;
    for (long long i = t; i < per; i += kThreads) {
      const int4 v = p[i];
      acc.x ^= v.x;
    }
    if (acc.x == 0x12345678) out[3] = acc.x;
  }
}

// D: one load at a time over L2-resident lines (a ring of next indices, 256 B apart).
__global__ void chase(const unsigned* next, int steps, long long* out) {
  unsigned i = 0;
  const unsigned long long t0 = ptx::globaltimer();
  for (int k = 0; k < steps; ++k) i = ld_relaxed_gpu_u32(next + i);
  const unsigned long long t1 = ptx::globaltimer();
  out[0] = static_cast<long long>(t1 - t0) / steps + (i == 0xFFFFFFFFu);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint32_t* ws;
  unsigned* arrive;
  unsigned long long* stamps;
  long long* out;
  const long long stream_elems = (1ll << 30) / 16;  // 1 GB
  int4* stream;
  if (cudaMalloc(&ws, kSlots * kRows * kWords * 4) || cudaMalloc(&arrive, 8) || cudaMalloc(&stamps, 64 * 8) ||
      cudaMalloc(&out, 8 * 8) || cudaMalloc(&stream, stream_elems * 16))
    return 1;
  cudaMemset(stream, 1, stream_elems * 16);
  const int grid = 2 * sms;  // two CTAs per SM, as attn2's 224
  // The start barrier needs every CTA resident: the whole carveout to shared memory.
  cudaFuncSetAttribute(poll_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, poll_kernel, kThreads, 0);
  if (per_sm * sms < grid) {
    std::printf("only %d CTAs per SM fit\n", per_sm);
    return 8;
  }
  auto run = [&](int mode, int delay_ns, double* first_us, double* after_last_us, double* polls) {
    std::vector<double> f, a, np;
    for (int r = 0; r < 21; ++r) {
      cudaMemset(ws, mode == 0 ? 0xFF : 0, kSlots * kRows * kWords * 4);
      cudaMemset(arrive, 0, 8);
      cudaMemset(stamps, 0, 64 * 8);
      poll_kernel<<<grid, kThreads>>>(ws, mode, delay_ns, stream, stream_elems, arrive, stamps, out);
      long long o[3];
      unsigned long long st[1 + kSlots];
      cudaMemcpy(o, out, sizeof(o), cudaMemcpyDeviceToHost);
      cudaMemcpy(st, stamps, sizeof(st), cudaMemcpyDeviceToHost);
      unsigned long long last = 0;
      for (int s = 0; s < kSlots; ++s) last = std::max(last, st[1 + s]);
      f.push_back(o[0] / 1e3);
      a.push_back(mode == 0 ? 0.0 : (static_cast<long long>(st[0]) - static_cast<long long>(last)) / 1e3);
      np.push_back(static_cast<double>(o[2]));
    }
    std::sort(f.begin(), f.end());
    std::sort(a.begin(), a.end());
    std::sort(np.begin(), np.end());
    *first_us = f[10];
    *after_last_us = a[10];
    *polls = np[10];
    return cudaGetLastError() == cudaSuccess;
  };
  std::printf("grid %d CTAs of %d threads (two per SM); %d slots x %d rows, %d loads in flight per polling thread\n",
              grid, kThreads, kSlots, kRows, 2 * kSlots);
  std::printf("%-44s %10s %16s %8s\n", "case", "1st poll", "all seen - last", "polls");
  double f, a, n;
  if (!run(0, 0, &f, &a, &n)) return 2;
  std::printf("%-44s %10.2f %16s %8.0f\n", "A: words already written", f, "-", n);
  for (int delay : {0, 500, 1000}) {
    if (!run(1, delay, &f, &a, &n)) return 3;
    std::printf("B: stored now, slot s after %4d ns x (s + 1)    %10.2f %16.2f %8.0f\n", delay, f, a, n);
  }
  for (int delay : {0, 500, 1000}) {
    if (!run(2, delay, &f, &a, &n)) return 4;
    std::printf("C: as B, the other SMs streaming from DRAM %4d %10.2f %16.2f %8.0f\n", delay, f, a, n);
  }
  for (int delay : {0, 1000}) {
    if (!run(3, delay, &f, &a, &n)) return 5;
    std::printf("E: as C, none streaming on the poller's SM %4d %10.2f %16.2f %8.0f\n", delay, f, a, n);
  }
  for (int delay : {0, 1000}) {
    if (!run(4, delay, &f, &a, &n)) return 6;
    std::printf("F: as C, the streams by bulk copies        %4d %10.2f %16.2f %8.0f\n", delay, f, a, n);
  }
  for (int delay : {0, 1000}) {
    if (!run(5, delay, &f, &a, &n)) return 7;
    std::printf("G: as F, the poll by bulk copies too       %4d %10.2f %16.2f %8.0f\n", delay, f, a, n);
  }
  {
    const int lines = 4096, stride = 64;  // 1 MB ring, L2-resident after the first pass
    std::vector<unsigned> h(lines * stride, 0);
    // One cycle: a permutation by a stride coprime with lines.
    for (int k = 0; k < lines; ++k) h[k * stride] = ((k + 1237) % lines) * stride;
    unsigned* next;
    cudaMalloc(&next, h.size() * 4);
    cudaMemcpy(next, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    chase<<<1, 1>>>(next, lines, out);  // warm the L2
    std::vector<double> v;
    for (int r = 0; r < 5; ++r) {
      chase<<<1, 1>>>(next, 2048, out);
      long long o;
      cudaMemcpy(&o, out, 8, cudaMemcpyDeviceToHost);
      v.push_back(o / 1e3);
    }
    std::sort(v.begin(), v.end());
    std::printf("D: one relaxed load at a time, L2-resident: %.3f us per load\n", v[2]);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("poll_latency: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
