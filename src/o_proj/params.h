// o_proj's device layer as the host layer, the tools, the tests and the
// benchmarks reach it (through the internal include folder src/): the kernel
// parameters, those of a checked call, the unchecked launch and the one-time
// setup. The kernels are defined in o_proj.cu; a build without CUDA answers
// their entries with kCudaErrorNotSupported (o_proj_host.cc).
#pragma once

#include <cstdint>
#include <string_view>

#include "muse_decode/tensor.h"

namespace muse_decode {
struct OProjArgs;
}  // namespace muse_decode

namespace muse_decode::o_proj_impl {

// The kernel's parameters: every field is filled by params_of() alone.
struct Params {
  const void* x = nullptr;       // bf16 [num_tokens, in_width]; 16-byte aligned
  int64_t x_stride = 0;          // elements between rows of x, multiple of 8
  const void* weight = nullptr;  // bf16 [8192, in_width] contiguous; 16-byte aligned
  void* out = nullptr;           // bf16 [num_tokens, 8192]; 16-byte aligned
  int64_t out_stride = 0;        // elements between rows of out, multiple of 8
  int num_tokens = 0;            // 1..64
  int in_width = 0;              // K: 512, 1024, 2048, 4096 or 8192
  bool pdl = false;              // launch with programmatic dependent launch
};

// Checks every argument of a call, out included (std::invalid_argument
// naming it), and returns the kernel's parameters; launches nothing and
// needs no GPU.
Params params_of(const OProjArgs& args);

// The check of the weight (std::invalid_argument naming it `name`), which
// attention_block shares: bf16 [8192, k] contiguous and 16-byte aligned, on
// CUDA device `device` (< 0: the weight decides it); k_source says where k
// comes from in the text ("(x's width)"); k < 0: any supported width.
void check_weight(const TensorRef& weight, std::string_view name, int64_t k, std::string_view k_source, int device);

// Enqueues the kernel the dispatch table picks for p; no argument checks.
// Returns the CUDA error as int.
int launch(const Params& p, Stream stream);

// Sets every o_proj kernel's attributes on the current device (dynamic
// shared memory) and checks the driver's tensor-map encoder. Returns the CUDA
// error as int.
int set_kernel_attributes();

}  // namespace muse_decode::o_proj_impl
