// Which GPUs the kernels run on, and the reason others are refused.
#pragma once

#include <string>

namespace muse_decode {

enum class GpuFamily {
  kNone,    // no CUDA device visible (or built without CUDA)
  kSm90,    // Hopper: H100, H200 (tested target)
  kSm100,   // Blackwell datacenter: B200, B300, GB200 (builds; sm_100a)
  kOther,   // a CUDA GPU the kernels were not built for
};

const char* gpu_family_name(GpuFamily family);

// The three queries below take a CUDA device ordinal or -1 (the current
// device); they throw std::invalid_argument for a device below -1 and
// otherwise never throw, whatever the machine has.
//
// Family of CUDA device `device`.
GpuFamily gpu_family(int device = -1);
// Human-readable name of the device, e.g. "NVIDIA H200 (sm_90, 132 SMs, 60 MB
// L2)", or why there is none.
std::string describe_device(int device = -1);
// Number of multiprocessors of `device` (0 when none).
int sm_count(int device = -1);

bool supported_family(GpuFamily family);

// The reason a deployment whose GPUs cannot run `kernel` ("route", "attn2",
// "qkv_front" or "o_proj") is refused. Throws std::invalid_argument for any other name.
std::string unavailable(const std::string& kernel);

// True when the library was compiled with its CUDA kernels.
bool built_with_cuda();

}  // namespace muse_decode
