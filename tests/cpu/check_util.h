// What the CPU tests of the host checks share.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

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

}  // namespace muse_decode::testing
