// qkv_front's kernels as the host layer (qkv_front_host.cc) reaches them: one
// launch entry and the one-time setup, defined in qkv_front.cu (in a build
// without CUDA, by the host layer as kCudaErrorNotSupported).
#pragma once

#include "muse_decode/qkv_front.h"

namespace muse_decode::detail {

// Enqueues the kernel the dispatch table picks for p; no argument checks.
// Returns the CUDA error as int.
int qkv_front_launch(const QkvFrontParams& p, Stream stream);

// Sets every qkv_front kernel's attributes on the current device (dynamic
// shared memory) and checks the driver's tensor-map encoder. Returns the CUDA
// error as int.
int qkv_front_set_kernel_attributes();

}  // namespace muse_decode::detail
