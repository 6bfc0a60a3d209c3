// Throughput of exp2 on the special-function units: ex2.approx.f32 and the
// packed ex2.approx.ftz.bf16x2, and of the f32 -> bf16x2 conversion, per clock
// and SM (at the nominal 1.98 GHz), over a grid of 8 CTAs per SM.
#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
__global__ void k_f32(float* out, float seed, int iters) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = seed * (threadIdx.x + i) * -1e-3f;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(a[i]));
  float s = 0; for (int i = 0; i < 8; ++i) s += a[i];
  if (s == 12345.f) out[0] = s;
}
__global__ void k_bf2(float* out, float seed, int iters) {
  uint32_t a[8];
  for (int i = 0; i < 8; ++i) { __nv_bfloat162 v = __floats2bfloat162_rn(seed * -1e-3f * i, seed * -2e-3f); a[i] = *(uint32_t*)&v; }
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(a[i]));
  uint32_t s = 0; for (int i = 0; i < 8; ++i) s ^= a[i];
  if (s == 12345u) out[0] = s;
}
__global__ void k_cvt(float* out, float seed, int iters) {
  float a[8]; uint32_t r[8];
  for (int i = 0; i < 8; ++i) { a[i] = seed * (threadIdx.x + i); r[i] = 0; }
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) { uint32_t t; asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(t) : "f"(a[i]), "f"(a[(i+1)&7])); r[i] ^= t; }
  uint32_t s = 0; for (int i = 0; i < 8; ++i) s ^= r[i];
  if (s == 12345u) out[0] = s;
}
int main() {
  float* out; cudaMalloc(&out, 4);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int iters = 4096, blocks = 132 * 8, threads = 256;
  const double n = double(iters) * 8 * blocks * threads;
  for (int k = 0; k < 3; ++k) {
    float ms;
    cudaEventRecord(e0); k_f32<<<blocks, threads>>>(out, 1.f, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1); printf("ex2.f32      : %.2f instr/clk/SM at 1.98 GHz (%.3f ms)\n", n / (ms * 1e-3) / 132 / 1.98e9, ms);
    cudaEventRecord(e0); k_bf2<<<blocks, threads>>>(out, 1.f, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1); printf("ex2.bf16x2   : %.2f instr/clk/SM (x2 values) (%.3f ms)\n", n / (ms * 1e-3) / 132 / 1.98e9, ms);
    cudaEventRecord(e0); k_cvt<<<blocks, threads>>>(out, 1.f, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1); printf("cvt bf16x2   : %.2f instr/clk/SM (%.3f ms)\n", n / (ms * 1e-3) / 132 / 1.98e9, ms);
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
