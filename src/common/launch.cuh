// One launch path for the ops' kernels (route, qkv_front, attn2, o_proj), and the
// driver entry points they need (cuLaunchKernelEx, cuTensorMapEncodeTiled): grid,
// block, dynamic shared memory, an optional cluster and programmatic
// dependent launch (PDL).
//
// Host cost matters here (at most 5 us per op, and a bare
// launch already takes 2.8-4.4 us of it on the H200 hosts). The runtime's
// cudaLaunchKernelEx looks the kernel up in the current context on every call;
// this calls the driver's cuLaunchKernelEx (through the runtime's entry-point
// query: no link to libcuda) on the context-free kernel handle that
// cudaGetKernel returns once per kernel (the runtime call stays as the
// fallback where the driver lacks the entry point).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "hardware.h"

namespace muse_decode::detail {

struct LaunchShape {
  dim3 grid, block;
  unsigned smem_bytes = 0;
  int cluster = 0;  // CTAs per cluster along x; 0: no cluster attribute
  bool pdl = false;
  bool cooperative = false;  // every CTA resident at once (the launch fails where they do not fit)
};

// The most attributes a LaunchShape asks for.
inline constexpr int kMaxLaunchAttributes = 3;

// A driver API function through the runtime's entry-point query (no link to
// libcuda); nullptr where the driver lacks it.
template <typename Fn>
Fn driver_entry(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(f);
}

inline PFN_cuLaunchKernelEx_v11060 driver_launch_fn() {
  static const auto fn = driver_entry<PFN_cuLaunchKernelEx_v11060>("cuLaunchKernelEx", 11060);
  return fn;
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn() {
  static const auto fn = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

// The context-free handle of kernel `Kernel`, looked up once.
template <auto Kernel>
cudaKernel_t kernel_handle() {
  static const cudaKernel_t k = [] {
    cudaKernel_t h = nullptr;
    if (cudaGetKernel(&h, Kernel) != cudaSuccess) {
      cudaGetLastError();
      h = nullptr;
    }
    return h;
  }();
  return k;
}

static_assert(kCudaSuccess == cudaSuccess && kCudaErrorInvalidValue == cudaErrorInvalidValue &&
                  kCudaErrorNotSupported == cudaErrorNotSupported,
              "hardware.h names the runtime's error codes");

// The runtime's launch attributes are the driver's under other names (same
// layout, same ids), so one array serves both calls.
static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute) &&
                  offsetof(cudaLaunchAttribute, val) == offsetof(CUlaunchAttribute, value),
              "runtime and driver launch attributes share a layout");
static_assert(static_cast<int>(cudaLaunchAttributeClusterDimension) ==
                      static_cast<int>(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) &&
                  static_cast<int>(cudaLaunchAttributeCooperative) == static_cast<int>(CU_LAUNCH_ATTRIBUTE_COOPERATIVE) &&
                  static_cast<int>(cudaLaunchAttributeProgrammaticStreamSerialization) ==
                      static_cast<int>(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION),
              "runtime and driver launch attributes share their ids");

// The cluster, PDL and cooperative attributes of `s` into attr; returns how many.
inline unsigned launch_attributes(const LaunchShape& s, cudaLaunchAttribute (&attr)[kMaxLaunchAttributes]) {
  unsigned n = 0;
  if (s.cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(s.cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (s.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (s.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  return n;
}

// The runtime's launch configuration of `s` on `stream`, its attributes in
// `attr` (which must outlive the configuration): for cudaLaunchKernelEx and
// the occupancy queries (cudaOccupancyMaxActiveClusters).
inline cudaLaunchConfig_t runtime_config(const LaunchShape& s, cudaLaunchAttribute (&attr)[kMaxLaunchAttributes],
                                         cudaStream_t stream = nullptr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = s.grid;
  config.blockDim = s.block;
  config.dynamicSmemBytes = s.smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = launch_attributes(s, attr);
  return config;
}

// The dynamic shared memory a CTA of Kernel may take (above 48 KB the kernel
// needs the attribute); set once per device, in prepare_<op>.
template <auto Kernel>
cudaError_t set_smem_limit(int bytes) {
  return cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Launches Kernel(args...) on `stream`; returns the CUDA error as int.
template <auto Kernel, typename... Args>
int launch_kernel(const LaunchShape& s, cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute attr[kMaxLaunchAttributes];
  const unsigned n = launch_attributes(s, attr);
  const auto launch = driver_launch_fn();
  const cudaKernel_t k = kernel_handle<Kernel>();
  if (launch && k) {
    CUlaunchConfig config = {};
    config.gridDimX = s.grid.x;
    config.gridDimY = s.grid.y;
    config.gridDimZ = s.grid.z;
    config.blockDimX = s.block.x;
    config.blockDimY = s.block.y;
    config.blockDimZ = s.block.z;
    config.sharedMemBytes = s.smem_bytes;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = reinterpret_cast<CUlaunchAttribute*>(attr);
    config.numAttrs = n;
    void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
    // A CUkernel stands for its function in the current context (CUDA 12).
    return static_cast<int>(launch(&config, reinterpret_cast<CUfunction>(k), params, nullptr));
  }
  const cudaLaunchConfig_t config = runtime_config(s, attr, stream);
  return static_cast<int>(cudaLaunchKernelEx(&config, Kernel, args...));
}

}  // namespace muse_decode::detail
