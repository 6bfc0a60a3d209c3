// Helpers of the GPU suite: device buffers, a skip when no supported GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "muse_decode/arch.h"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(expr)

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (!muse_decode::supported_family(muse_decode::gpu_family()))                         \
      GTEST_SKIP() << "needs an SM90 or SM100 GPU; this machine has: "                      \
                   << muse_decode::describe_device();                                        \
  } while (0)

// SplitMix64: the random inputs of the qkv_front and attention_block tests.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T) + 16) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  // Both synchronize the device: a pageable upload may still be in flight
  // when cudaMemcpy returns, and the tests' own streams are non-blocking (not
  // ordered after the legacy stream).
  void upload(const std::vector<T>& host) const {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  void fill_bytes(int byte) const {
    cudaMemset(ptr_, byte, n_ * sizeof(T));
    cudaDeviceSynchronize();
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }
