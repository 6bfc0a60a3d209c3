// qkv_front: the attention front of Muse Spark for 1..16 tokens (the contract:
// docs/contract.md).
// One launch computes y = x W^T (the fused [q | k | v | gate] projection, fp32
// accumulation), the weightless RMS norm of every q and k head, interleaved
// RoPE when the layer has it, writes out [T, N] bf16 and inserts each KV
// head's k and v into the paged KV cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {

// ---------------------------------------------------------------------------
// Sizing.

// Whether qkv_front serves a projection of output width n for num_kv_heads
// KV heads: n == qkv_width(num_kv_heads), num_kv_heads in {1, 2, 4, 8, 16}
// (TP16, TP8, TP4, TP2, TP1 of Muse Spark's 16 KV heads); false for any
// other pair of integers.
bool qkv_front_supports_shape(int n, int num_kv_heads);

// CTAs of a launch for num_kv_heads on a GPU with sm_count multiprocessors:
// one per SM (a persistent stream-K grid over the weight's 8 KB blocks of
// one head's 64 rows x 64 columns), never more than there are blocks.
int qkv_front_ctas(int num_kv_heads, int sm_count);
// Bytes of the workspace a launch of qkv_front_ctas(num_kv_heads, sm_count)
// CTAs needs: one arrival counter per tile, then one 4 KB partial per (CTA,
// tile it touches). The caller zeroes it once when allocating it; every launch
// leaves the counters at zero again. Throws on an unsupported num_kv_heads or
// sm_count < 1.
int64_t qkv_front_workspace_bytes(int num_kv_heads, int sm_count);
// The same for CUDA device `device` (its multiprocessor count; -1: current).
// Throws std::invalid_argument on an unsupported num_kv_heads or when there is
// no such device.
int64_t qkv_front_workspace_bytes_for_device(int num_kv_heads, int device = -1);

// ---------------------------------------------------------------------------
// Where each part of the front's output rows [q | k | v | gate] starts, and
// the row width, for num_kv_heads KV heads (1, 2, 4, 8 or 16; throws
// std::invalid_argument naming num_kv_heads otherwise). q and gate are 8
// heads of 64 per KV head, k and v one each.
struct QkvColumns {
  int64_t k = 0;      // q spans [0, k)
  int64_t v = 0;      // k spans [k, v)
  int64_t gate = 0;   // v spans [v, gate)
  int64_t width = 0;  // gate spans [gate, width); width == qkv_width(num_kv_heads)
};
QkvColumns qkv_front_columns(int num_kv_heads);

// The q and gate column views of the front's output rows [q | k | v | gate]
// (q and gate: 8 heads of 64 per KV head), with qkv's row stride. Throws
// std::invalid_argument when qkv is not [T, qkv_width(num_kv_heads)].
struct QkvViews {
  TensorRef q;     // [T, 8 * num_kv_heads * 64], columns 0 .. H*64
  TensorRef gate;  // [T, 8 * num_kv_heads * 64], the last H*64 columns
};
QkvViews split_qkv(const TensorRef& qkv, int num_kv_heads);

// ---------------------------------------------------------------------------
// What vLLM's attention layer carries about its QKV projection and rotary
// table, checked once when the layer is bound.
struct RotaryDesc {
  bool present = false;        // the layer has a rotary embedding object
  int rotary_dim = kHeadDim;   // dims it rotates
  bool is_neox_style = false;  // neox (halves) instead of interleaved pairs
  TensorRef cos_sin;           // fp32 [max_pos, 64]: cos in 0:32, sin in 32:64
};

struct ProjectionDesc {
  bool quantized = false;      // a quant method other than unquantized linear
  bool has_bias = false;
  bool gather_output = false;  // the TP projection gathers its output columns
  int tp_size = 1;
  TensorRef weight;            // bf16 [N, 8192], contiguous, 16-byte aligned
  int num_heads = 0;           // query heads of this rank
  int num_kv_heads = 0;        // KV heads of this rank
  int head_dim = kHeadDim;
  bool use_rope = false;       // sliding-window layers; full-attention layers have none
  RotaryDesc rotary;
};

// Why the front cannot read this layer's projection and rotary table, or
// nullopt when it can.
std::optional<std::string> unsupported_projection(const ProjectionDesc& attn);

// ---------------------------------------------------------------------------
// One call.
struct QkvFrontArgs {
  TensorRef x;             // bf16 [T, 8192], 1 <= T <= 16, unit column stride, row stride a multiple
                           // of 8 elements, 16-byte aligned (read with TMA); decides the device
  TensorRef weight;        // bf16 [N, 8192] contiguous, N = qkv_width(num_kv_heads), 16-byte aligned
  TensorRef positions;     // int64 [T] contiguous (rows of cos_sin; clamped into the table)
  TensorRef cos_sin;       // fp32 [max_pos, 64] contiguous (cos | sin); absent: a layer without RoPE
  TensorRef slot_mapping;  // int64 [T] contiguous; -1 (or any slot outside the cache): no insert
  TensorRef kv_cache;      // bf16 [pages, num_kv_heads, 16, 128] contiguous, 16-byte aligned
  int num_kv_heads = 0;    // 1, 2, 4, 8 or 16
  TensorRef out;           // bf16 [T, N], unit column stride, row stride a multiple of 8, 16-byte aligned
  TensorRef workspace;     // contiguous 1-D, >= qkv_front_workspace_bytes_for_device(num_kv_heads, device)
                           // bytes, 16-byte aligned, zeroed when allocated
  bool pdl = true;         // launch with programmatic dependent launch: the kernel streams its weight
                           // before griddepcontrol.wait and reads x, positions and slot_mapping after
};

// Why the front does not take this call (the argument, the expected and the
// actual value), or nullopt when it does; the caller then keeps the unfused
// path. `out` and `workspace` may be absent: then the check of everything
// else. With both present, the same text check_qkv_front throws.
std::optional<std::string> unsupported_qkv_front_call(const QkvFrontArgs& args);
// unsupported_qkv_front_call(args) is nullopt.
bool qkv_front_supports_call(const QkvFrontArgs& args);

// Checks every argument, out and workspace included (std::invalid_argument
// naming it, before anything is launched); launches nothing and needs no GPU
// (the workspace's size is that of the device's multiprocessor count, 1
// where there is none).
void check_qkv_front(const QkvFrontArgs& args);

// check_qkv_front, then the launch on `stream`. Throws std::invalid_argument
// on bad arguments or a device prepare_qkv_front has not set up,
// std::runtime_error on a launch error. Allocates nothing, never
// synchronises; capturable in a CUDA graph.
void qkv_front(const QkvFrontArgs& args, Stream stream);

// One-time setup for CUDA device `device` (-1: the current one): the kernels'
// shared-memory limit, the driver's tensor-map encoder, the multiprocessor
// count. Call it outside graph capture, before the first call on that device.
// Throws std::invalid_argument on a GPU the kernels were not built for (or a
// device that is not there) and std::runtime_error when the CUDA runtime
// refuses the setup.
void prepare_qkv_front(int device = -1);

// The front bound to a layer's weight, rotary table (absent: no RoPE), KV
// cache, KV-head count and workspace: the constructor validates them once
// (std::invalid_argument naming the argument) and prepares the weight's
// device; a call passes the step's tensors and runs qkv_front() (every check
// still runs on every call). The bound views must stay valid: bind again after
// replacing one.
class QkvFront {
 public:
  QkvFront(const TensorRef& weight, const TensorRef& cos_sin, const TensorRef& kv_cache, int num_kv_heads,
           const TensorRef& workspace);

  void operator()(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                  const TensorRef& out, Stream stream, bool pdl = true) const;

  // The QkvFrontArgs of one call (what operator() passes to qkv_front()).
  QkvFrontArgs args(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                    const TensorRef& out, bool pdl = true) const;

 private:
  TensorRef weight_, cos_sin_, kv_cache_, workspace_;
  int num_kv_heads_;
};

}  // namespace muse_decode
