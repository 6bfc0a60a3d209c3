// o_proj: the attention output projection of the verify step's rows
// (docs/contract.md). One launch computes out = bf16(x W^T) for 1..64 rows of
// attn2's output x [T, K] and this rank's slice of the projection weight
// [8192, K] (vLLM's RowParallelLinear weight, [out, in]): this rank's partial
// sum, which the engine's all-reduce completes. fp32 accumulation, rounded
// once; the same bits on every run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {

// ---------------------------------------------------------------------------
// Shapes.
inline constexpr int kOProjMaxTokens = 64;         // 8 rows per request, up to 8 requests
inline constexpr int kOProjOutWidth = kHiddenSize;  // 8192 output columns (weight rows)

// The input width K of a rank with num_kv_heads KV heads: its 8 * num_kv_heads
// query heads of 64 (attn2's output row). 1024 at TP8, 8192 at TP1.
constexpr int o_proj_in_width(int num_kv_heads) { return kHeadsPerKvHead * num_kv_heads * kHeadDim; }
static_assert(o_proj_in_width(2) == 1024, "TP8 rank: 16 query heads of 64");
static_assert(o_proj_in_width(16) == 8192, "TP1: 128 query heads of 64");

// Whether o_proj serves input width k: o_proj_in_width(num_kv_heads) for
// num_kv_heads in {1, 2, 4, 8, 16} (TP16, TP8, TP4, TP2, TP1): 512, 1024,
// 2048, 4096 or 8192.
bool o_proj_supports_in_width(int64_t k);

// No workspace: every CTA owns whole output columns over all of K and sums
// them in a fixed order in its own shared memory, so no split of K crosses
// CTAs and no o_proj_workspace_bytes exists.

// ---------------------------------------------------------------------------
// What vLLM's attention layer carries about its output projection
// (RowParallelLinear), checked once when the layer is bound.
struct OutProjectionDesc {
  bool quantized = false;         // a quant method other than unquantized linear
  bool has_bias = false;
  bool input_is_parallel = true;  // the input arrives split over the TP ranks (attn2's out of this rank)
  int tp_size = 1;
  int num_heads = 0;              // query heads of this rank: K = num_heads * head_dim
  int head_dim = kHeadDim;
  TensorRef weight;               // bf16 [8192, K], contiguous, 16-byte aligned
};

// Why o_proj cannot compute this layer's output projection, or nullopt when
// it can.
std::optional<std::string> unsupported_o_proj(const OutProjectionDesc& attn);

// ---------------------------------------------------------------------------
// One call.
struct OProjArgs {
  TensorRef x;       // bf16 [T, K], 1 <= T <= 64, K = the weight's columns; unit column stride, row stride a
                     // multiple of 8 elements, 16-byte aligned (read with TMA); decides the device
  TensorRef weight;  // bf16 [8192, K] contiguous, o_proj_supports_in_width(K), 16-byte aligned
  TensorRef out;     // bf16 [T, 8192], unit column stride, row stride a multiple of 8, 16-byte aligned;
                     // must not overlap x or weight
  bool pdl = true;   // launch with programmatic dependent launch: the kernel streams its weight before
                     // griddepcontrol.wait and reads x (the previous kernel's output) after it
};

// Why o_proj does not take this call (the argument, the expected and the
// actual value), or nullopt when it does; the caller then keeps the stock
// GEMM. `out` may be absent: then the check of everything else. With out
// present, the same text check_o_proj throws.
std::optional<std::string> unsupported_o_proj_call(const OProjArgs& args);
// unsupported_o_proj_call(args) is nullopt.
bool o_proj_supports_call(const OProjArgs& args);

// Checks every argument, out included (std::invalid_argument naming it,
// before anything is launched); launches nothing and needs no GPU.
void check_o_proj(const OProjArgs& args);

// check_o_proj, then the launch on `stream`. Throws std::invalid_argument on
// bad arguments or a device prepare_o_proj has not set up, std::runtime_error
// on a launch error. Allocates nothing, never synchronises; capturable in a
// CUDA graph.
void o_proj(const OProjArgs& args, Stream stream);

// One-time setup for CUDA device `device` (-1: the current one): the kernels'
// shared-memory limit and the driver's tensor-map encoder. Call it outside
// graph capture, before the first call on that device. Throws
// std::invalid_argument on a GPU the kernels were not built for (or a device
// that is not there) and std::runtime_error when the CUDA runtime refuses the
// setup.
void prepare_o_proj(int device = -1);

// o_proj bound to a layer's weight: the constructor validates it once
// (std::invalid_argument naming the argument) and prepares its device; a call
// passes the step's x and out and runs o_proj() (every check still runs on
// every call). The bound view must stay valid: bind again after replacing it.
class OProj {
 public:
  explicit OProj(const TensorRef& weight);

  void operator()(const TensorRef& x, const TensorRef& out, Stream stream, bool pdl = true) const;

  // The OProjArgs of one call (what operator() passes to o_proj()).
  OProjArgs args(const TensorRef& x, const TensorRef& out, bool pdl = true) const;

  const TensorRef& weight() const { return weight_; }

 private:
  TensorRef weight_;
};

}  // namespace muse_decode
