// MUSE_HOST_DEVICE: functions the kernels call that are plain integer code,
// compiled for the host too so that CPU tests reach them (g++ sees no
// CUDA qualifiers).
#pragma once

#ifdef __CUDACC__
#define MUSE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MUSE_HOST_DEVICE inline
#endif
