// What the architecture being compiled offers the kernels, tested once: the
// warpgroup MMA (wgmma) exists on sm_90a only; sm_100a and the host pass take
// the mma.sync paths.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MUSE_DECODE_ARCH_HAS_WGMMA 1
#else
#define MUSE_DECODE_ARCH_HAS_WGMMA 0
#endif

namespace muse_decode::arch {

inline constexpr bool kHasWgmma = MUSE_DECODE_ARCH_HAS_WGMMA;

}  // namespace muse_decode::arch
