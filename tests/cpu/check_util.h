// What the tests of the host checks share (the GPU tests include it too).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "muse_decode/arch.h"

namespace muse_decode::testing {

// The std::invalid_argument text f throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

// Fake device addresses: the checks read shapes and addresses, never data.
inline void* addr(uintptr_t a) { return reinterpret_cast<void*>(a); }

// A device ordinal no test prepares and no machine has: the ops' "needs
// prepare" path and prepare's refusal, with no launch on any machine.
constexpr int kUnpreparedDevice = 63;

// The text prepare_<op>(device) throws on a device the kernels cannot run:
// the op once, the GPUs it runs on, and what the device is.
inline std::string prepare_refusal(const std::string& op, int device) {
  return op + " runs only on SM90 (H100/H200) or the SM100 family (B200/B300); found: " + describe_device(device);
}

}  // namespace muse_decode::testing
