// How fast one SM runs attn2's math (S = Q K^T, the softmax, O += P V) with
// the keys already in shared memory, by schedule and exp2 form.
//
// The design question (docs/attn2.md, "Designs measured and set aside"):
// whether a one-cluster-per-KV-head attn2 at 8k (16 SMs per head, each taking
// 8 tiles of 64 keys for 64 query rows, the copies issued a call ahead) could
// beat the split grid, which turns on what its math alone costs. The pipes'
// own cost is ~256 clocks of tensor cores and ~256 of MUFU per tile. This micro times the math alone, one CTA per SM, W consumer
// warpgroups, each running T tiles from its own 8 / W stages (tile i on stage
// i mod 8 / W: no copies, no barriers on data). Schedules:
//   serial    per tile: S, wait, softmax, P V, wait;
//   overlap   S of tile i + 1 issued with P V of tile i, the softmax beside
//             the tensor cores (FA3's intra-warpgroup overlap; attn2's sm_90a
//             key loop);
//   pingpong  overlap, and the two warpgroups take turns to issue their
//             wgmma groups (named barriers), so that one's softmax runs
//             while the other's matrices do (FA3's inter-warpgroup schedule).
// Each with exp2 in fp32 (`ex2.approx.ftz.f32`, as attn2) or on bf16 pairs
// (`ex2.approx.ftz.bf16x2`: two per MUFU issue, P already packed), and with
// the row max on every tile or on the first only (as attn2's later tiles);
// then the overlap schedule's parts by removal (wrong results, timing only);
// last, part of the exp2s on the FMA pipe (`poly_exp2`, FA4's way: K of a
// tile's 8 n-tiles, printed pK/8), with the cubic's worst relative error.
//
//   cmake --build build --target pingpong_math && build/pingpong_math
//
// Needs an sm_90 GPU (wgmma; elsewhere it says so and exits). One row per
// case: schedule, exp2 form, max ("every" tile or the "first"), W, CTAs, T,
// then clocks per warpgroup over the T tiles (median and max over the CTAs'
// warpgroups, 6 launches after a warm-up), the same in us at 1.98 GHz, and
// the median us per tile. The last line is the device's error state.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/ptx.cuh"
#include "common/sm90_wgmma.cuh"

using muse_decode::ptx::exp2_approx;
using muse_decode::ptx::fence_proxy_async_smem;
using muse_decode::ptx::named_barrier_sync;
using muse_decode::ptx::pack_bf16;
using muse_decode::ptx::pin;
using muse_decode::ptx::pin_a;
using muse_decode::ptx::smem_addr;
using muse_decode::ptx::sw128_desc;
using muse_decode::ptx::unpack_bf16;
using muse_decode::ptx::wgmma_commit;
using muse_decode::ptx::wgmma_fence;
using muse_decode::ptx::wgmma_rs;
using muse_decode::ptx::wgmma_ss;
using muse_decode::ptx::wgmma_wait;

constexpr int kRing = 8;                   // 16 KB stages per CTA, split over its warpgroups
constexpr int kTileBytes = 16384;          // K (64 keys x 128 B) then V
constexpr int kQBytes = 8192;              // 64 rows x 64 dims, bf16
constexpr int kSmem = kQBytes + kRing * kTileBytes + 1024;
[[maybe_unused]] constexpr float kScaleLog2 = 0.6841258107984375f * 1.4426950408889634f;

enum Mode { kSerial = 0, kOverlap = 1, kPingPong = 2 };

// exp2 of both, as a bf16 pair; kept here: the product's exp2 is fp32
// (ptx::exp2_approx; docs/attn2.md sets the bf16x2 form aside).
__device__ __forceinline__ uint32_t ex2_bf16x2(float lo, float hi) {
  const __nv_bfloat162 in = __floats2bfloat162_rn(lo, hi);
  uint32_t x = *reinterpret_cast<const uint32_t*>(&in), y;
  asm("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
// A register copy ptxas keeps (a plain move it may fold, and then P's
// registers are S's, written by the next S while P V reads them: serialized);
// kept here: only the bf16x2 exp2's P, already packed, needs it.
__device__ __forceinline__ uint32_t copy_reg(uint32_t x) {
  uint32_t y;
  asm volatile("prmt.b32 %0, %1, 0, 0x3210;" : "=r"(y) : "r"(x));
  return y;
}
// Arrival at named barrier kId over kThreads threads without waiting; kept
// here: the product's named barriers only sync (named_barrier_sync).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}
// Keeps a wgmma descriptor in its register (an empty asm), so that it is
// computed before the wgmma group's fence; kept here: the product's
// sm90_wgmma.cuh pins accumulators and A fragments only.
__device__ __forceinline__ void pin_desc(uint64_t& d) { asm volatile("" : "+l"(d)); }

// O's rows times their alpha (the online softmax's rescale; attn2 has its own
// beside its softmax).
__device__ __forceinline__ void rescale(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
}
// 2^x on the FMA and integer pipes (FA4's way of taking load off the MUFU):
// x = j + f by the 1.5 * 2^23 shifter (j nearest, f in [-0.5, 0.5]), a cubic
// for 2^f (fitted here to 7.5e-5 relative error, far under P's bf16
// rounding), j added to the exponent bits. x clamped at -127 (P then 0 or
// subnormal-flushed, as ex2.approx.ftz gives).
__device__ __forceinline__ float poly_exp2(float x) {
  x = fmaxf(x, -127.0f);
  const float t = x + 12582912.0f;  // j in t's low mantissa bits
  const float f = x - (t - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.05517167f, f, 0.24261115f), f, 0.69326099f), f, 0.99992807f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// The tile's softmax: s (64 x 64 scores of this thread's fragment) -> P as
// wgmma A fragments pa, running max m and sums l of the thread's 2 rows,
// alpha the factor O takes. with_max: a row max of this tile (else m stays).
// kPoly of the 8 n-tiles (f32 path) take poly_exp2 instead of the MUFU's.
template <bool kBf16Exp, int kPoly = 0>
__device__ __forceinline__ void softmax(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                        bool with_max) {
  alpha[0] = alpha[1] = 1.0f;
  if (with_max) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      mx[0] = fmaxf(mx[0], fmaxf(s[t][0], s[t][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[t][2], s[t][3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
      alpha[r] = exp2_approx((m[r] - mx[r]) * kScaleLog2);
      l[r] *= alpha[r];
      m[r] = mx[r];
    }
  }
  const float nmc[2] = {-m[0] * kScaleLog2, -m[1] * kScaleLog2};
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const float x0 = fmaf(s[t][0], kScaleLog2, nmc[0]), x1 = fmaf(s[t][1], kScaleLog2, nmc[0]);
    const float x2 = fmaf(s[t][2], kScaleLog2, nmc[1]), x3 = fmaf(s[t][3], kScaleLog2, nmc[1]);
    if constexpr (kBf16Exp) {  // the pairs' bits in s[t][0] and s[t][2]
      const uint32_t p01 = ex2_bf16x2(x0, x1), p23 = ex2_bf16x2(x2, x3);
      const float2 a = unpack_bf16(p01), b = unpack_bf16(p23);
      l[0] += a.x + a.y;
      l[1] += b.x + b.y;
      s[t][0] = __uint_as_float(p01);
      s[t][2] = __uint_as_float(p23);
      s[t][1] = s[t][3] = 0.0f;  // (defined: S's registers stay whole for the next S)
    } else {
      const bool poly = (t * kPoly) / 8 != ((t + 1) * kPoly) / 8;  // kPoly n-tiles spread over the 8
      auto e2 = [poly](float x) { return poly ? poly_exp2(x) : exp2_approx(x); };
      s[t][0] = e2(x0), s[t][1] = e2(x1), s[t][2] = e2(x2), s[t][3] = e2(x3);
      l[0] += s[t][0] + s[t][1];
      l[1] += s[t][2] + s[t][3];
    }
  }
}

// P (in s, from softmax) as the A fragments of O += P V's 4 k-steps.
template <bool kBf16Exp>
__device__ __forceinline__ void pack(const float (&s)[8][4], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    pa[t / 2][(t % 2) * 2] = kBf16Exp ? copy_reg(__float_as_uint(s[t][0])) : pack_bf16(s[t][0], s[t][1]);
    pa[t / 2][(t % 2) * 2 + 1] = kBf16Exp ? copy_reg(__float_as_uint(s[t][2])) : pack_bf16(s[t][2], s[t][3]);
  }
}

// kParts (the overlap schedule's parts, for timing by removal; wrong results
// without all three): 1 S, 2 the softmax (else P = S as it is), 4 P V.
template <int kWgs, int kMode, bool kBf16Exp, bool kEveryMax, int kParts = 7, int kPoly = 0>
__global__ void __launch_bounds__(kWgs * 128, 1) math_loop(int tiles, long long* clocks, float* sink) {
  static_assert(kParts == 7 || kMode == kOverlap, "parts are removed from the overlap schedule only");
  static_assert(kMode != kPingPong || kWgs == 2, "the ping-pong schedule is for two warpgroups");
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma is sm_90a's (the build compiles every micro for sm_100a too; main() checks the GPU)
#else
  constexpr int kStages = kRing / kWgs;  // per warpgroup
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  uint8_t* gbase = smem + (base - smem_addr(smem));
  // Small pseudo-random bf16 everywhere (|scores| stay far from overflow).
  for (int i = threadIdx.x; i < (kSmem - 1024) / 4; i += blockDim.x) {
    const uint32_t h = (i * 2654435761u) ^ (blockIdx.x * 40503u);
    const float a = ((h & 0xFFFF) / 65536.0f - 0.5f) * 0.5f, b = ((h >> 16) / 65536.0f - 0.5f) * 0.5f;
    reinterpret_cast<uint32_t*>(gbase)[i] = pack_bf16(a, b);
  }
  fence_proxy_async_smem();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const uint32_t q = base, stage0 = base + kQBytes + wg * kStages * kTileBytes;
  auto k_of = [&](int i) { return stage0 + (i % kStages) * kTileBytes; };
  // Descriptors computed (and pinned) before the wgmma group's fence: address
  // arithmetic between a group's wgmmas makes ptxas serialize them (C7513).
  uint64_t dq[4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    dq[ks] = sw128_desc(q + ks * 32, 16, 1024);
    pin_desc(dq[ks]);
  }
  auto descs = [&](uint64_t (&d)[4], uint32_t at, uint32_t step, uint32_t lbo) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      d[k] = sw128_desc(at + k * step, lbo, 1024);
      pin_desc(d[k]);
    }
  };
  auto issue_s = [&](float (&acc)[8][4], int i) {
    if constexpr (!(kParts & 1)) {
      wgmma_fence();
      return;
    }
    uint64_t dk[4];
    descs(dk, k_of(i), 32, 16);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_ss(acc, dq[ks], dk[ks], ks);
  };
  float o[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  auto issue_pv = [&](const uint32_t (&pa)[4][4], int i) {
    if constexpr (!(kParts & 4)) {
      wgmma_fence();
      return;
    }
    uint64_t dv[4];
    descs(dv, k_of(i) + 8192, 2048, 8192);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs(o, pa[kk], dv[kk]);
  };
  // Ping-pong: warpgroup w issues its wgmma groups after bar.sync on barrier
  // 3 + w and then lets the other go (bar.arrive on 3 + 1 - w), 256 threads.
  auto my_turn = [&] {
    if constexpr (kMode == kPingPong) {
      if (wg == 0) named_barrier_sync<3, 256>();
      else named_barrier_sync<4, 256>();
    }
  };
  auto your_turn = [&] {
    if constexpr (kMode == kPingPong) {
      if (wg == 0) named_barrier_arrive<4, 256>();
      else named_barrier_arrive<3, 256>();
    }
  };
  float m[2] = {-1e30f, -1e30f}, l[2] = {0.0f, 0.0f}, alpha[2];
  float s[8][4];
  if constexpr (!(kParts & 1)) {  // (no S: scores made up once)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = 0.01f * static_cast<float>((threadIdx.x * 7 + t * 4 + e) % 13);
  }
  uint32_t pa[4][4];
  __syncthreads();
  const long long t0 = clock64();
  if constexpr (kMode == kPingPong) {
    if (wg == 1) named_barrier_arrive<3, 256>();  // warpgroup 0 goes first
  }
  if constexpr (kMode == kSerial) {
    for (int i = 0; i < tiles; ++i) {
      issue_s(s, i);
      wgmma_commit();
      wgmma_wait<0>();
      pin(s);
      softmax<kBf16Exp, kPoly>(s, m, l, alpha, kEveryMax || i == 0);
      pack<kBf16Exp>(s, pa);
      rescale(o, alpha);
      pin(o);
      pin_a(pa);
      issue_pv(pa, i);
      wgmma_commit();
      wgmma_wait<0>();
      pin(o);
      pin_a(pa);
    }
  } else {
    my_turn();
    issue_s(s, 0);
    wgmma_commit();
    if (tiles > 1 || wg == 0) your_turn();  // (warpgroup 1's last turn is not passed on: the arrivals balance)
    wgmma_wait<0>();
    pin(s);
    softmax<kBf16Exp, kPoly>(s, m, l, alpha, true);
    pack<kBf16Exp>(s, pa);
    pin_a(pa);
    for (int i = 0; i + 1 < tiles; ++i) {
      my_turn();
      issue_s(s, i + 1);
      wgmma_commit();
      issue_pv(pa, i);
      wgmma_commit();
      if (i + 2 < tiles || wg == 0) your_turn();
      wgmma_wait<1>();  // S of tile i + 1
      pin(s);
      float a2[2] = {1.0f, 1.0f};
      if constexpr ((kParts & 2) != 0) softmax<kBf16Exp, kPoly>(s, m, l, a2, kEveryMax);
      wgmma_wait<0>();  // P V of tile i
      pin(o);
      pin_a(pa);  // (read by that P V until here)
      rescale(o, a2);
      pack<kBf16Exp>(s, pa);
      pin(o);  // (both defined before the next wgmma group's fence, not sunk past it)
      pin_a(pa);
    }
    issue_pv(pa, tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    pin(o);
  }
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * kWgs + wg] = t1 - t0;
  float acc = l[0] + l[1];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc += o[n][0] + o[n][1] + o[n][2] + o[n][3];
  if (acc == 1234.5f) sink[threadIdx.x] = acc;  // keeps the work
#endif
}

template <int kWgs, int kMode, bool kBf16Exp, bool kEveryMax, int kParts = 7, int kPoly = 0>
void run(const char* name, int ctas, int tiles, long long* d_clocks, float* sink) {
  auto k = math_loop<kWgs, kMode, kBf16Exp, kEveryMax, kParts, kPoly>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  std::vector<long long> all;
  for (int r = 0; r < 7; ++r) {
    k<<<ctas, kWgs * 128, kSmem>>>(tiles, d_clocks, sink);
    std::vector<long long> h(ctas * kWgs);
    cudaMemcpy(h.data(), d_clocks, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    if (r > 0) all.insert(all.end(), h.begin(), h.end());
  }
  if (cudaGetLastError() != cudaSuccess) {
    std::printf("%s: launch failed\n", name);
    return;
  }
  std::sort(all.begin(), all.end());
  const double med = all[all.size() / 2], mx = all.back();
  char exp_name[8];
  std::snprintf(exp_name, sizeof exp_name, "%s", kBf16Exp ? "bf16" : kPoly ? "p0/8" : "f32");
  if (kPoly) exp_name[1] = static_cast<char>('0' + kPoly);
  std::printf("%-9s %-5s %-5s %4d %5d %5d %9.0f %9.0f %8.2f %8.2f %8.3f\n", name, exp_name,
              kEveryMax ? "every" : "first", kWgs, ctas, tiles, med, mx, med / 1980.0, mx / 1980.0,
              med / 1980.0 / tiles);
}

// poly_exp2 against exp2f over x in [-125, 10] (1 << 20 points): the worst relative error.
__global__ void poly_error_kernel(float* worst) {
  float w = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (1 << 20); i += gridDim.x * blockDim.x) {
    const float x = -125.0f + 135.0f * static_cast<float>(i) / static_cast<float>(1 << 20);
    const float ref = exp2f(x);
    w = fmaxf(w, fabsf(poly_exp2(x) - ref) / ref);
  }
  atomicMax(reinterpret_cast<int*>(worst), __float_as_int(w));  // (w >= 0: int order is float order)
}

double poly_error(float* d_worst) {
  cudaMemset(d_worst, 0, sizeof(float));
  poly_error_kernel<<<64, 256>>>(d_worst);
  float w = -1.0f;
  cudaMemcpy(&w, d_worst, sizeof(float), cudaMemcpyDeviceToHost);
  return w;
}

template <int kPoly>
void poly_rows(long long* d_clocks, float* sink) {
  for (int tiles : {1, 4, 8}) {
    run<2, kPingPong, false, false, 7, kPoly>("pingpong", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 7, kPoly>("overlap", 32, tiles, d_clocks, sink);
  }
  run<4, kOverlap, false, false, 7, kPoly>("overlap", 32, 2, d_clocks, sink);
  for (int tiles : {4, 8}) run<2, kOverlap, false, false, 2, kPoly>("softmax", 32, tiles, d_clocks, sink);
}

int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::printf("pingpong_math: needs an sm_90 GPU (wgmma)\n");
    return 0;
  }
  long long* d_clocks;
  float* sink;
  cudaMalloc(&d_clocks, 2 * 1024 * sizeof(long long));
  cudaMalloc(&sink, 1024 * sizeof(float));
  std::printf("one CTA per SM, W consumer warpgroups of 64 rows, T tiles of 64 keys each per warpgroup\n"
              "(8k, one cluster per head: 8 tiles per SM, W = 2 and T = 4, or W = 4 and T = 2)\n");
  std::printf("%-9s %-5s %-5s %4s %5s %5s %9s %9s %8s %8s %8s\n", "schedule", "exp2", "max", "W", "CTAs", "T", "clk med",
              "clk max", "us med", "us max", "us/tile");
  for (int ctas : {32, 132}) {
    for (int tiles : {1, 2, 4, 8}) {
      run<2, kSerial, false, true>("serial", ctas, tiles, d_clocks, sink);
      run<2, kOverlap, false, true>("overlap", ctas, tiles, d_clocks, sink);
      run<2, kOverlap, false, false>("overlap", ctas, tiles, d_clocks, sink);
      run<2, kPingPong, false, true>("pingpong", ctas, tiles, d_clocks, sink);
      run<2, kPingPong, false, false>("pingpong", ctas, tiles, d_clocks, sink);
      run<2, kPingPong, true, false>("pingpong", ctas, tiles, d_clocks, sink);
      run<2, kOverlap, true, false>("overlap", ctas, tiles, d_clocks, sink);
    }
    for (int tiles : {1, 2, 4}) {  // four warpgroups: twice the warps to hide latencies, half the tiles each
      run<4, kSerial, false, true>("serial", ctas, tiles, d_clocks, sink);
      run<4, kOverlap, false, true>("overlap", ctas, tiles, d_clocks, sink);
      run<4, kOverlap, false, false>("overlap", ctas, tiles, d_clocks, sink);
      run<4, kOverlap, true, false>("overlap", ctas, tiles, d_clocks, sink);
    }
  }
  // The overlap schedule's parts by removal (W = 2, T = 4 and 8, 32 CTAs; wrong results).
  for (int tiles : {4, 8}) {
    run<2, kOverlap, false, false, 1>("S only", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 4>("PV only", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 5>("S + PV", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 2>("softmax", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 3>("S + sm", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 6>("sm + PV", 32, tiles, d_clocks, sink);
    run<2, kOverlap, false, false, 7>("all", 32, tiles, d_clocks, sink);
  }
  // exp2 partly on the FMA pipe (p<k>/8: k of the 8 n-tiles by poly_exp2), 32 CTAs.
  std::printf("\nexp2 partly by poly_exp2 (pK/8: K of a tile's 8 n-tiles); its worst relative error over\n"
              "x in [-125, 10]: %.2e\n", poly_error(sink));
  poly_rows<1>(d_clocks, sink);
  poly_rows<2>(d_clocks, sink);
  poly_rows<3>(d_clocks, sink);
  poly_rows<4>(d_clocks, sink);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("pingpong_math: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
