// GPU family detection. With MUSE_DECODE_WITH_CUDA the CUDA runtime is asked;
// a CPU-only build sees no device.
#include "muse_decode/arch.h"

#include <string>

#include "checks.h"
#include "no_device.h"

#ifdef MUSE_DECODE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace muse_decode {

const char* gpu_family_name(GpuFamily family) {
  switch (family) {
    case GpuFamily::kNone: return "none";
    case GpuFamily::kSm90: return "sm90";
    case GpuFamily::kSm100: return "sm100";
    case GpuFamily::kOther: return "other";
  }
  return "other";
}

bool built_with_cuda() {
#ifdef MUSE_DECODE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool supported_family(GpuFamily family) {
  return family == GpuFamily::kSm90 || family == GpuFamily::kSm100;
}

// The ops unavailable() answers for: every op of the library, in the order an
// unknown name's refusal lists them.
constexpr const char* kKernels[] = {"route", "attn2", "qkv_front", "o_proj", "attention_block"};

std::string unavailable(const std::string& kernel) {
  for (const char* k : kKernels)
    if (kernel == k) return detail::cat("GPUs other than ", detail::kSupportedGpus, " (", kernel, ")");
  std::string known;
  for (const char* k : kKernels) known += detail::cat(known.empty() ? "" : ", ", k);
  detail::fail_expected("kernel", detail::cat("one of ", known), detail::cat("'", kernel, "'"));
}

namespace detail {
namespace {
std::string cuda_version(int v) { return cat(v / 1000, ".", v % 1000 / 10); }
}  // namespace

std::string no_device_reason(int driver_version, int runtime_version, bool driver_too_old,
                             const std::string& runtime_error) {
  if (driver_version == 0) return "no CUDA device (no NVIDIA driver found: the CUDA runtime could not load libcuda.so.1)";
  if (driver_too_old && driver_version > 0)
    return cat("no CUDA device (the NVIDIA driver supports CUDA ", cuda_version(driver_version), ", older than the CUDA ",
               cuda_version(runtime_version), " runtime this library is built with: update the driver)");
  if (runtime_error.empty()) return "no CUDA device";
  return cat("no CUDA device (", runtime_error, ")");
}
}  // namespace detail

namespace {
// -1 names the current device; other negative numbers name none.
void require_device_ordinal(int device) {
  if (device < -1) detail::fail_expected("device", "-1 (the current device) or an ordinal >= 0", device);
}
}  // namespace

#ifdef MUSE_DECODE_WITH_CUDA
namespace {
// Resolves `device` (-1: the current one) and whether it is visible; `why`
// says why not.
bool visible_device(int& device, std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why) {
      int driver = 0, runtime = 0;
      if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = -1;  // unknown: not "none found"
      cudaRuntimeGetVersion(&runtime);
      *why = detail::no_device_reason(driver, runtime, err == cudaErrorInsufficientDriver,
                                      err == cudaSuccess ? "" : cudaGetErrorString(err));
    }
    return false;
  }
  device = detail::resolve_device(device);
  if (device >= count) {
    if (why) *why = "CUDA device " + std::to_string(device) + " is not visible";
    return false;
  }
  return true;
}

bool properties(int device, cudaDeviceProp* prop, std::string* why) {
  if (!visible_device(device, why)) return false;
  if (cudaGetDeviceProperties(prop, device) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "CUDA device " + std::to_string(device) + " is not visible";
    return false;
  }
  return true;
}
}  // namespace

GpuFamily gpu_family(int device) {
  require_device_ordinal(device);
  cudaDeviceProp prop;
  if (!properties(device, &prop, nullptr)) return GpuFamily::kNone;
  if (prop.major == 9 && prop.minor == 0) return GpuFamily::kSm90;
  // sm_100a code runs on compute capability 10.0 (B200/GB200) and 10.3 (B300).
  if (prop.major == 10 && (prop.minor == 0 || prop.minor == 3)) return GpuFamily::kSm100;
  return GpuFamily::kOther;
}

std::string describe_device(int device) {
  require_device_ordinal(device);
  cudaDeviceProp prop;
  std::string why;
  if (!properties(device, &prop, &why)) return why;
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.multiProcessorCount) + " SMs, " + std::to_string(prop.l2CacheSize >> 20) + " MB L2)";
}

// One attribute rather than the whole cudaDeviceProp (which the runtime fills
// field by field): qkv_front's checks ask for it on a device not yet prepared.
int sm_count(int device) {
  require_device_ordinal(device);
  int sms = 0;
  if (!visible_device(device, nullptr)) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

namespace detail {
int resolve_device(int device) {
  require_device_ordinal(device);
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = 0;
  }
  return device;
}

DeviceScope::DeviceScope(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device) cudaSetDevice(device);
}

DeviceScope::~DeviceScope() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}
}  // namespace detail
#else
GpuFamily gpu_family(int device) {
  require_device_ordinal(device);
  return GpuFamily::kNone;
}
std::string describe_device(int device) {
  require_device_ordinal(device);
  return "no CUDA device (this build has no CUDA kernels)";
}
int sm_count(int device) {
  require_device_ordinal(device);
  return 0;
}

namespace detail {
int resolve_device(int device) {
  require_device_ordinal(device);
  return device < 0 ? 0 : device;
}
DeviceScope::DeviceScope(int) {}
DeviceScope::~DeviceScope() {}
}  // namespace detail
#endif

}  // namespace muse_decode
