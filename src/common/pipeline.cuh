// The pipeline every op's loads go through: a ring of S stages between a
// producer (the thread that issues a stage's TMA or bulk copies) and its
// consumers (the warps that read the stage), with one full and one empty
// mbarrier per stage.
//
// A stage's i-th fill: the producer acquires it (waits until the consumers
// released fill i - S, at once on the first round) and arms its full
// barrier with the copies' byte count; the copies complete on it; the
// consumers wait for it, read the stage and release it (one arrival each on
// the empty barrier). A Position carries the stage and the parity of the
// phase its barriers complete for that fill; no op computes parity itself.
#pragma once

#include <cstdint>

#include "ptx.cuh"

namespace muse_decode::pipeline {

// Fill i of a ring of S stages: stage i % S, whose barriers complete phase
// i / S for it, parity (i / S) % 2.
template <int S>
struct Position {
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ static Position of(int i) { return {i % S, static_cast<uint32_t>((i / S) & 1)}; }
  // Fill i < S (the ring's first round), without the division.
  __device__ __forceinline__ static Position first(int i) { return {i, 0u}; }
  __device__ __forceinline__ void advance() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// How a thread waits: kYield gives the waiting warp's issue slots to the
// others (ptx::mbar_wait: rings of many waits per CTA), kSpin tests again at
// once (ptx::mbar_wait_spin: attn2's few waits on its critical path);
// ptx.cuh has the measurement behind each.
enum class Wait { kYield, kSpin };

// S stages of kStageBytes from `base` (a shared-window address), their full
// and empty barriers.
template <int S, int kStageBytes, Wait kWait = Wait::kYield>
struct Ring {
  static constexpr int kStages = S;
  static_assert(S >= 1, "a ring of at least one stage");

  uint32_t base;
  uint64_t* full;   // [S]: one arrival (the producer's) and the copies' bytes
  uint64_t* empty;  // [S]: one arrival per consumer

  __device__ __forceinline__ uint32_t stage_addr(int stage) const {
    return base + static_cast<uint32_t>(stage * kStageBytes);
  }
  __device__ __forceinline__ uint32_t stage_addr(Position<S> at) const { return stage_addr(at.stage); }
  // The full barrier of at's stage, as the copies of that fill name it.
  __device__ __forceinline__ uint32_t full_bar(Position<S> at) const { return ptx::smem_addr(&full[at.stage]); }

  // (One thread, before any use of the barriers.)
  __device__ __forceinline__ void init(uint32_t consumers) const {
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], consumers);
    }
  }

  // The producer: waits until the consumers released the stage's previous
  // fill (on the ring's first round that phase reads as complete).
  __device__ __forceinline__ void acquire(Position<S> at) const { wait_on(&empty[at.stage], at.phase ^ 1u); }
  // The producer's arrival on the stage's full barrier, expecting `bytes` of
  // copies (0: the fill holds no copy).
  __device__ __forceinline__ void arm(Position<S> at, uint32_t bytes) const {
    ptx::mbar_arrive_expect_tx(&full[at.stage], bytes);
  }
  // A consumer: waits until the fill's copies have landed.
  __device__ __forceinline__ void wait(Position<S> at) const { wait_on(&full[at.stage], at.phase); }
  // A consumer's release of the fill (one arrival: a consumer is whatever
  // init counted, a warp in every op here).
  __device__ __forceinline__ void release(Position<S> at) const { ptx::mbar_arrive(&empty[at.stage]); }

 private:
  __device__ __forceinline__ static void wait_on(uint64_t* bar, uint32_t parity) {
    if constexpr (kWait == Wait::kSpin)
      ptx::mbar_wait_spin(bar, parity);
    else
      ptx::mbar_wait(bar, parity);
  }
};

}  // namespace muse_decode::pipeline
