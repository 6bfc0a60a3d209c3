// attention_block: one layer's attention of the verify step in one launch
// (docs/contract.md): x [R*8, 8192] in, this rank's o_proj partial
// [R*8, 8192] out, and in between exactly qkv_front (the QKV + gate
// projection, q/k RMS norm, RoPE, the KV-cache insert), attn2 (paged
// attention of the 8 new rows per request, o-norm, sigmoid gate) and o_proj
// (the output projection). One persistent kernel, one CTA per SM, launched
// cooperatively: every CTA it waits on is resident.
//
// Bits: the same on every run and whatever the grid (the work is cut into a
// fixed number of shares, kAttentionBlockShares, whichever CTA runs them).
// They are not those of the three ops chained: the ops cut K of the front
// and the keys of attention by the GPU they run on, the block by its fixed
// shares, so their fp32 sums associate differently (both within the
// correctness bar of the fp64 reference). The KV cache ends holding the
// block's k and v, bit for bit the k and v columns of the block's own
// projection.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muse_decode/attn2.h"
#include "muse_decode/constants.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/tensor.h"

namespace muse_decode {

// ---------------------------------------------------------------------------
// Where it serves.
inline constexpr int kAttentionBlockMaxReqs = 8;  // 1..8 requests of 8 rows
// The work's fixed cut: the front's weight blocks, the attention's key
// slices and o_proj's output tiles are dealt to this many shares; a CTA runs
// one share or, on a GPU with fewer SMs, several in turn.
inline constexpr int kAttentionBlockShares = 132;

// Whether the block serves a rank of num_kv_heads KV heads (2: TP8, 4: TP4).
bool attention_block_supports_kv_heads(int num_kv_heads);

// Key slices per (request, KV head): the shares the attention phase deals to
// each of them, bounded by the 8-page groups of the longest row
// (max_model_len, or the window's W + 7 keys), so that every slice holds at
// least one group. Checks its arguments as a call would (num_reqs in [1, 8],
// num_kv_heads 2 or 4, max_model_len >= 8, window 0 or in
// [1, max_model_len): std::invalid_argument naming one).
int attention_block_splits(int num_reqs, int num_kv_heads, int max_model_len, int window);

// The workspace of a call of up to num_reqs requests: the projection's rows,
// the attention's output rows, the partial sums and the counters (the most
// that any request count from 1 to num_reqs lays out, so that one workspace
// sized for a deployment's max_reqs serves every step). Zero it once when
// allocating it; every launch leaves it ready for the next (its counters
// count by launch). Checks its arguments as a call would.
int64_t attention_block_workspace_bytes(int num_reqs, int num_kv_heads, int max_model_len, int window);

// ---------------------------------------------------------------------------
// What a layer carries, checked once when it is bound: the three ops' own
// descriptions and the deployment.
struct AttentionBlockLayer {
  ProjectionDesc projection;  // qkv_front's (unsupported_projection)
  Attn2Layer attention;       // attn2's (unsupported_attn2)
  OutProjectionDesc output;   // o_proj's (unsupported_o_proj)
  int num_kv_heads = 0;       // this rank's
  int max_model_len = 0;
  int max_reqs = 1;           // requests a step may carry
  std::optional<int> sliding_window;  // the layer's (none: full attention); the call's window is
                                      // attn2_window(sliding_window, max_model_len)
};

// Why the block cannot serve this layer (the first of the three ops' reasons,
// then the block's own), or nullopt when it can.
std::optional<std::string> unsupported_attention_block(const AttentionBlockLayer& layer);

// ---------------------------------------------------------------------------
// One call: R = x's rows / 8 requests.
struct AttentionBlockArgs {
  TensorRef x;              // bf16 [R*8, 8192], 1 <= R <= 8; unit column stride, row stride % 8 == 0,
                            // 16-byte aligned (read with TMA); decides the device
  TensorRef qkv_weight;     // bf16 [N, 8192] contiguous, N = qkv_width(num_kv_heads), 16-byte aligned
  TensorRef positions;      // int64 [R*8] contiguous (rows of cos_sin; clamped into the table)
  TensorRef cos_sin;        // fp32 [max_pos, 64] contiguous; absent: a layer without RoPE
  TensorRef slot_mapping;   // int64 [R*8] contiguous; a slot outside the cache: no insert
  TensorRef kv_cache;       // bf16 [pages, num_kv_heads, 16, 128] contiguous, 16-byte aligned
  int num_kv_heads = 0;     // attention_block_supports_kv_heads
  TensorRef block_table;    // int32 [R, max_pages], unit column stride, max_pages >= ceil(max_model_len / 16)
  TensorRef seq_lens;       // int32 [R] contiguous: 8 <= L <= max_model_len, the 8 new tokens included
  int max_model_len = 0;    // of the deployment: sizes the work and bounds L
  int window = 0;           // attn2_window(layer's sliding window, max_model_len); 0 = none
  TensorRef o_proj_weight;  // bf16 [8192, K] contiguous, K = o_proj_in_width(num_kv_heads), 16-byte aligned
  TensorRef out;            // bf16 [R*8, 8192], unit column stride, row stride % 8 == 0, 16-byte aligned;
                            // must not overlap any input
  TensorRef workspace;      // attention_block_workspace_bytes(R, num_kv_heads, max_model_len, window) bytes,
                            // contiguous, 16-byte aligned, zeroed when allocated
};
// Device-side values outside the contract (L outside [8, max_model_len], a
// page id outside the cache) give NaN rows of that request, as attn2's, and
// no access outside the tensors; slots outside the cache insert nothing.

// Why the block does not take this call (the argument, the expected and the
// actual value), or nullopt when it does; the caller then keeps the three
// ops. `out` and `workspace` may be absent: then the check of everything
// else. With both present, the same text check_attention_block throws.
std::optional<std::string> unsupported_attention_block_call(const AttentionBlockArgs& args);
bool attention_block_supports_call(const AttentionBlockArgs& args);

// Checks every argument, out and workspace included (std::invalid_argument
// naming it, before anything is launched); launches nothing, needs no GPU.
void check_attention_block(const AttentionBlockArgs& args);

// check_attention_block, then the launch on `stream`. Throws
// std::invalid_argument on bad arguments or a device prepare_attention_block
// has not set up, std::runtime_error on a launch error. Allocates nothing,
// never synchronises; capturable in a CUDA graph.
void attention_block(const AttentionBlockArgs& args, Stream stream);

// One-time setup for CUDA device `device` (-1: the current one): the
// kernel's shared-memory limit, the tensor-map encoder and the co-residency
// of one CTA per SM. Call it outside graph capture. Throws
// std::invalid_argument on a GPU the kernel was not built for (or a device
// that is not there), std::runtime_error when the runtime refuses the setup.
void prepare_attention_block(int device = -1);

// The block bound to a layer's static tensors: the constructor validates them
// once (std::invalid_argument naming the argument) and prepares the device; a
// call passes the step's tensors and runs attention_block() (every check
// still runs on every call). The bound views must stay valid.
class AttentionBlock {
 public:
  AttentionBlock(const TensorRef& qkv_weight, const TensorRef& cos_sin, const TensorRef& kv_cache, int num_kv_heads,
                 const TensorRef& o_proj_weight, int max_model_len, int window, const TensorRef& workspace);

  void operator()(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                  const TensorRef& block_table, const TensorRef& seq_lens, const TensorRef& out, Stream stream) const;

  // The AttentionBlockArgs of one call (what operator() passes).
  AttentionBlockArgs args(const TensorRef& x, const TensorRef& positions, const TensorRef& slot_mapping,
                          const TensorRef& block_table, const TensorRef& seq_lens, const TensorRef& out) const;

 private:
  TensorRef qkv_weight_, cos_sin_, kv_cache_, o_proj_weight_, workspace_;
  int num_kv_heads_, max_model_len_, window_;
};

}  // namespace muse_decode
