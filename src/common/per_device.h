// A value per CUDA device, set once outside the per-call path (a prepare_*
// call) and read on every call with one acquire load: the host budget of a
// call is a few microseconds.
#pragma once

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace muse_decode::detail {

// Device ordinals below kMaxDevices have a slot; prepare_* refuses others.
inline constexpr int kMaxDevices = 64;

template <typename T>
class PerDevice {
 public:
  // The value of `device`, or nullptr before set() (or outside the table).
  const T* find(int device) const {
    if (device < 0 || device >= kMaxDevices) return nullptr;
    const Slot& s = slots_[device];
    return s.ready.load(std::memory_order_acquire) ? &s.value : nullptr;
  }

  // The value of `device`, computed by make(device) on the first call
  // (serialised; a make that throws leaves the slot empty). Throws
  // std::invalid_argument for a device outside [0, kMaxDevices).
  template <typename Make>
  const T& get_or_make(int device, Make&& make) {
    if (const T* v = find(device)) return *v;
    if (device < 0 || device >= kMaxDevices)
      throw std::invalid_argument("device must be in [0, " + std::to_string(kMaxDevices) + "), got " +
                                  std::to_string(device));
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& s = slots_[device];
    if (!s.ready.load(std::memory_order_relaxed)) {
      s.value = std::forward<Make>(make)(device);
      s.ready.store(true, std::memory_order_release);
    }
    return s.value;
  }

 private:
  struct Slot {
    std::atomic<bool> ready{false};
    T value{};
  };
  std::mutex mutex_;
  Slot slots_[kMaxDevices];
};

}  // namespace muse_decode::detail
