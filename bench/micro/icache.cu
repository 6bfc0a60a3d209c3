// What a cold instruction cache costs: clocks per instruction of straight-line
// code run the first time against the same code run again.
//
// Every warp runs one straight-line block of N independent FFMAs (8 chains, so
// a warm warp issues ~1 per clock) three times in a loop; the first pass
// fetches the block's code, the next two find it cached. Blocks of 4, 32 and
// 128 KB of code; 1 CTA of 1 warp, 1 CTA of 8 warps, or 132 CTAs of 8 warps
// (one per SM on an H200); three launches in a row (the first launch of a
// kernel also fetches its code from DRAM; the later ones find it in the L2).
// docs/attn2.md ("Where the time goes") rules instruction fetch out of
// attn2's time with it.
//
//   cmake --build build --target icache && build/icache
//
// One line per block, shape and launch: clocks per instruction of pass 0
// (cold; median and max over warps) and of pass 1 (warm; median). The last
// line is the device's error state.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/ptx.cuh"

namespace ptx = muse_decode::ptx;

// The timed blocks, kept here: straight-line FFMA code is this micro's probe.
#define F8                                                                                                     \
  "fma.rn.f32 %0, %0, %8, %9;\n fma.rn.f32 %1, %1, %8, %9;\n fma.rn.f32 %2, %2, %8, %9;\n"                    \
  "fma.rn.f32 %3, %3, %8, %9;\n fma.rn.f32 %4, %4, %8, %9;\n fma.rn.f32 %5, %5, %8, %9;\n"                    \
  "fma.rn.f32 %6, %6, %8, %9;\n fma.rn.f32 %7, %7, %8, %9;\n"
#define X2(s) s s
#define X4(s) s s s s
#define X32(s) X4(X4(X2(s)))
#define B32 X32(F8)            // 256 instructions, 4 KB
#define B256 X4(X2(B32))       // 2048, 32 KB
#define B1024 X4(B256)         // 8192, 128 KB

// One pass over block Kind (0: B32, 1: B256, 2: B1024) on the 8 chains a
// (the blocks above are the inline asm's text).
template <int Kind>
__device__ __forceinline__ void ffma_block(float (&a)[8], float c) {
  if (Kind == 0)
    asm volatile(B32 : "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]), "+f"(a[7])
                 : "f"(c), "f"(1e-7f));
  else if (Kind == 1)
    asm volatile(B256 : "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]), "+f"(a[7])
                 : "f"(c), "f"(1e-7f));
  else
    asm volatile(B1024 : "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]), "+f"(a[7])
                 : "f"(c), "f"(1e-7f));
}
// The SM's clock counter, kept here: the product reads no clock (its traces
// read %globaltimer).
__device__ __forceinline__ long long clock64_now() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

template <int Kind>
__global__ void straight(float* out, long long* t, float c) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = threadIdx.x * 1e-3f + i;
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const bool lead = threadIdx.x % 32 == 0;
  const unsigned smid = ptx::smid();
#pragma unroll 1
  for (int r = 0; r < 3; ++r) {
    const long long c0 = clock64_now();
    if (lead) t[w * 4 + r] = c0;
    ffma_block<Kind>(a, c);
  }
  const long long c3 = clock64_now();
  if (lead) t[w * 4 + 3] = c3;
  float s = 0;
  for (int i = 0; i < 8; ++i) s += a[i];
  if (s == 12345.0f) out[0] = s + smid;
}

template <int Kind>
void run(const char* name, int instr, int ctas, int threads, float* out, long long* t) {
  const int warps = ctas * threads / 32;
  std::vector<long long> h(warps * 4);
  for (int launch = 0; launch < 3; ++launch) {
    straight<Kind><<<ctas, threads>>>(out, t, 0.999f);
    cudaMemcpy(h.data(), t, h.size() * 8, cudaMemcpyDeviceToHost);
    std::vector<double> p0, p1;
    for (int w = 0; w < warps; ++w) {
      p0.push_back(double(h[w * 4 + 1] - h[w * 4]) / instr);
      p1.push_back(double(h[w * 4 + 2] - h[w * 4 + 1]) / instr);
    }
    std::sort(p0.begin(), p0.end());
    std::sort(p1.begin(), p1.end());
    printf("%-8s %4d CTAs x %3d threads, launch %d: clocks per instruction, pass 0 (cold) median %.2f max %.2f; "
           "pass 1 (warm) median %.2f\n",
           name, ctas, threads, launch, p0[warps / 2], p0.back(), p1[warps / 2]);
  }
}

int main() {
  float* out;
  long long* t;
  cudaMalloc(&out, 4);
  cudaMalloc(&t, 132 * 8 * 4 * 8);
  const int shapes[3][2] = {{1, 32}, {1, 256}, {132, 256}};
  for (auto& s : shapes) {
    run<0>("4 KB", 256, s[0], s[1], out, t);
    run<1>("32 KB", 2048, s[0], s[1], out, t);
    run<2>("128 KB", 8192, s[0], s[1], out, t);
  }
  printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
