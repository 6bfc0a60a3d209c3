// Why the CUDA runtime sees no device, in words that point at the fix: no
// NVIDIA driver at all, a driver older than the runtime, or the runtime's own
// text for anything else. Pure, so that the CPU tests check the wording on
// any machine.
#pragma once

#include <string>

namespace muse_decode::detail {

// driver_version and runtime_version as cudaDriverGetVersion and
// cudaRuntimeGetVersion give them (1000 * major + 10 * minor); a driver
// version of 0 says the runtime found no driver, one below 0 that it is not
// known. driver_too_old: the device count failed with
// cudaErrorInsufficientDriver, which the runtime also answers when there is
// no driver at all. runtime_error: the count's error text, empty when the
// count succeeded and found no device.
std::string no_device_reason(int driver_version, int runtime_version, bool driver_too_old,
                             const std::string& runtime_error);

}  // namespace muse_decode::detail
