// o_proj's kernels as the host layer (o_proj_host.cc) reaches them: one
// launch entry and the one-time setup, defined in o_proj.cu (in a build
// without CUDA, by the host layer as kCudaErrorNotSupported).
#pragma once

#include "muse_decode/o_proj.h"

namespace muse_decode::detail {

// Enqueues the kernel the dispatch table picks for p; no argument checks.
// Returns the CUDA error as int.
int o_proj_launch(const OProjParams& p, Stream stream);

// Sets every o_proj kernel's attributes on the current device (dynamic
// shared memory) and checks the driver's tensor-map encoder. Returns the CUDA
// error as int.
int o_proj_set_kernel_attributes();

}  // namespace muse_decode::detail
