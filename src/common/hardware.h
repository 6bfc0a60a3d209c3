// Limits of the GPUs the kernels are built for (sm_90a, sm_100a) that the
// shared-memory plans and the host's sizing depend on, and the CUDA error
// codes the host layer returns in a build without the CUDA headers.
#pragma once

namespace muse_decode::detail {

// Shared memory per SM (the whole unified L1 / shared array as shared memory,
// cudaSharedmemCarveoutMaxShared), and what the system reserves per CTA.
inline constexpr int kSmemPerSm = 228 * 1024;
inline constexpr int kSmemReservedPerCta = 1024;

// Shared memory a CTA may hold (dynamic and static) so that ctas_per_sm of
// them fit on one SM.
constexpr int smem_budget_per_cta(int ctas_per_sm) { return kSmemPerSm / ctas_per_sm - kSmemReservedPerCta; }

// Largest cluster the hardware places without the non-portable attribute.
inline constexpr int kPortableClusterSize = 8;

// cudaError_t values the host layer names without the CUDA headers (the
// kernels' files check them against cuda_runtime.h).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInvalidValue = 1;
inline constexpr int kCudaErrorNotSupported = 801;  // a build without CUDA kernels

}  // namespace muse_decode::detail
