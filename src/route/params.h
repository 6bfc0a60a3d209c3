// route's device layer as the host layer, the tools, the tests and the
// benchmarks reach it (through the internal include folder src/): the kernel
// parameters, those of a checked call and the unchecked launch. The kernel is
// defined in route.cu; a build without CUDA answers its entry with
// kCudaErrorNotSupported (route_host.cc).
#pragma once

#include <cstdint>

#include "muse_decode/tensor.h"

namespace muse_decode {
struct RouteArgs;
}  // namespace muse_decode

namespace muse_decode::route_impl {

// The kernel's parameters: every field is filled by params_of() alone.
struct Params {
  const float* logits = nullptr;   // [num_tokens, 256] fp32; rows 16-byte aligned
  int64_t logits_stride = 256;     // elements between rows, multiple of 4
  const float* bias = nullptr;     // [256] fp32, 16-byte aligned
  int32_t* ids = nullptr;          // [num_tokens, 8] global expert ids, contiguous
  float* weights = nullptr;        // [num_tokens, 8] fp32, contiguous
  int num_tokens = 0;              // 1..8
  float route_scale = 1.0f;
  int32_t* metadata = nullptr;     // may be null: no metadata
  int local_expert_offset = 0;
  int num_local_experts = 0;
  int tile_n = 0;
  bool pdl = false;                // launch with programmatic dependent launch
};

// Checks every argument of a call (std::invalid_argument naming it, with the
// expected and the actual value) and returns the kernel's parameters;
// launches nothing and needs no GPU.
Params params_of(const RouteArgs& args);

// Enqueues the routing kernel (with the metadata when p.metadata is set); no
// argument checks. Returns the CUDA error as int.
int launch(const Params& p, Stream stream);

}  // namespace muse_decode::route_impl
