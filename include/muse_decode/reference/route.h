// CPU reference of route: the test oracle, written for clarity.
#pragma once

#include <cstdint>
#include <vector>

#include "muse_decode/route.h"

namespace muse_decode::reference {

// Routing of num_tokens rows of 256 logits (row stride 256), docs/contract.md
// steps 1-5 in fp32 on the CPU. The only difference from the GPU is expf:
// the host libm and CUDA's expf may differ in the last bit, so a score can
// differ by an ulp; everything after the scores is the same arithmetic.
void route(const float* logits, int num_tokens, const float* bias, float route_scale,
           int32_t* ids, float* weights);

// The TRT-LLM-gen metadata of the given ids ([num_tokens, 8] global expert
// ids) for local experts [offset, offset + count) and tile_n, written into
// `metadata` (metadata_size(tile_n) elements) at the layout of route.h.
// Entries the kernel does not write are left as they are.
void routing_metadata(const int32_t* ids, int num_tokens, int local_expert_offset,
                      int num_local_experts, int tile_n, int32_t* metadata);

}  // namespace muse_decode::reference
