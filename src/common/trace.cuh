// Instrumentation of the kernels, compiled out by default. Built with
// -DMUSE_DECODE_TRACE=1, thread 0 of every CTA of an instrumented kernel
// writes one record per launch into a ring in device memory: the
// %globaltimer stamp of each named phase it reached, its SM, its CTA index,
// a launch-order sequence number and a tag of the kernel's choosing; the
// host dumps the ring to a file (bench/trace.py reads it: per phase, the
// first, median and last CTA of each call). Without it every call below is
// empty and the kernels compile to the code of a build that never had it.
//
// An op's kernel file names its ring once (MUSE_DECODE_TRACE_RING(name)),
// which also defines extern "C" int muse_decode_dump_<name>(const char* path)
// in a traced build, and its kernel holds a Recorder<Phase>, Phase an enum of
// at most kStampWords phases.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ptx.cuh"

#ifndef MUSE_DECODE_TRACE
#define MUSE_DECODE_TRACE 0
#endif

namespace muse_decode::trace {

inline constexpr int kRecordWords = 32;  // u64 words per record
inline constexpr int kStampWords = 24;   // words 0..23: phase stamps (ns), 0 where not reached
inline constexpr int kSmWord = 24;
inline constexpr int kCtaWord = 25;      // (z * gridDim.y + y) * gridDim.x + x
inline constexpr int kSeqWord = 26;      // order of entry over all launches
inline constexpr int kTagWord = 27;
inline constexpr int kRingRecords = 16384;

struct Ring {
  uint64_t (*records)[kRecordWords] = nullptr;
  unsigned* count = nullptr;
};

template <typename Phase, bool kOn = MUSE_DECODE_TRACE != 0>
class Recorder {
 public:
  // Claims this CTA's record and stamps phase 0 (the kernel's entry).
  __device__ __forceinline__ explicit Recorder(Ring ring) {
    if constexpr (kOn) {
      if (threadIdx.x != 0) return;
      const unsigned seq = atomicAdd(ring.count, 1u);
      rec_ = ring.records[seq % kRingRecords];
      for (int k = 1; k < kRecordWords; ++k) rec_[k] = 0;
      rec_[0] = ptx::globaltimer();
      rec_[kSmWord] = ptx::smid();
      rec_[kCtaWord] = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
      rec_[kSeqWord] = seq;
    }
  }
  // The stamp of `phase` now (thread 0 only).
  __device__ __forceinline__ void mark(Phase phase) {
    if constexpr (kOn)
      if (threadIdx.x == 0) rec_[static_cast<int>(phase)] = ptx::globaltimer();
  }
  // The stamp once `v` (a load's result) has arrived: the timer read waits for it.
  __device__ __forceinline__ void mark_after(Phase phase, int v) {
    if constexpr (kOn)
      if (threadIdx.x == 0) rec_[static_cast<int>(phase)] = ptx::globaltimer_after(static_cast<uint32_t>(v));
  }
  __device__ __forceinline__ void tag(uint64_t bits) {
    if constexpr (kOn)
      if (threadIdx.x == 0) rec_[kTagWord] = bits;
  }

 private:
  uint64_t* rec_ = nullptr;
};

// Writes the ring, oldest record first, as raw records; returns 0 or the CUDA error.
template <typename Records>
int dump(const Records& ring, const unsigned& count, const char* path) {
  static uint64_t host[kRingRecords][kRecordWords];
  unsigned n = 0;
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(host, ring, sizeof host);
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(&n, count, sizeof n);
  if (err != cudaSuccess) return static_cast<int>(err);
  FILE* f = std::fopen(path, "wb");
  if (!f) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned kept = n < kRingRecords ? n : kRingRecords;
  for (unsigned k = n - kept; k < n; ++k) std::fwrite(host[k % kRingRecords], sizeof host[0], 1, f);
  std::fclose(f);
  return 0;
}

}  // namespace muse_decode::trace

#if MUSE_DECODE_TRACE
#define MUSE_DECODE_TRACE_RING(name)                                                                   \
  __device__ uint64_t name##_records[::muse_decode::trace::kRingRecords][::muse_decode::trace::kRecordWords]; \
  __device__ unsigned name##_count;                                                                    \
  __device__ __forceinline__ ::muse_decode::trace::Ring name() { return {name##_records, &name##_count}; } \
  extern "C" int muse_decode_dump_##name(const char* path) {                                           \
    return ::muse_decode::trace::dump(name##_records, name##_count, path);                             \
  }
#else
#define MUSE_DECODE_TRACE_RING(name) \
  __device__ __forceinline__ ::muse_decode::trace::Ring name() { return {}; }
#endif
