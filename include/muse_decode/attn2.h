// attn2: paged attention of the 8-row speculative-decode verify step fused with
// the weightless RMS norm (o-norm) and the sigmoid gate of the attention output
// (the contract: docs/contract.md).
//
// One launch covers every KV head of the rank and every request. Its grid
// depends on the deployment only (max_model_len, window, KV heads, requests),
// never on the step's lengths, which the kernel reads from device memory: once
// prepare_attn2 has run, a call is capturable in a CUDA graph.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {

// ---------------------------------------------------------------------------
// Sizing (host, pure functions).

// max_model_len up to which one cluster per (request, KV head) covers every key.
inline constexpr int kAttn2ShortMaxLen = 2048;
// Bound of attn2_splits (and of the num_splits a call accepts).
inline constexpr int kAttn2MaxSplits = 32;

// What prepare_attn2 measured on a device: the one-slice path's cluster size
// and how many CTAs of the kernel fit on the GPU at once with clusters of 8
// and of 16 (cudaOccupancyMaxActiveClusters times the cluster size). The
// split heuristic fills that many; a split grid that fills exactly that many
// has its last cluster do less, and one that fits merges without tickets.
struct Attn2Residency {
  int short_cluster_size = 0;  // 16 where the GPU places a cluster of 16 (and no cap says 8), else 8
  int resident_ctas_8 = 0;
  int resident_ctas_16 = 0;
};

// An H200's residency (132 SMs, 2 CTAs per SM: 30 clusters of 8, 14 of 16; a
// cluster stays inside one GPC): what attn2_splits plans for on a host
// without a GPU.
inline constexpr Attn2Residency kH200Attn2Residency{16, 240, 224};

// Each sizing function checks every argument (std::invalid_argument naming it,
// with the expected and the actual value) as a call would: max_model_len >= 8,
// window 0 or in [1, max_model_len), num_kv_heads in [1, 16] (this rank's
// share of Muse Spark's 16), num_reqs in [1, 65535], num_splits in [1, 32].
//
// The window attn2 applies for a layer: 0 when the layer has none or when the
// window covers max_model_len (no key is then outside a row's window); a
// sliding_window below 1 is refused.
int attn2_window(std::optional<int> sliding_window, int max_model_len);

// Key slices per (request, KV head), each a cluster of 16 CTAs at 1-2 KV
// heads, else 8: 1 for max_model_len <= 2048 and for any window (a windowed
// row spans at most W + 7 keys), else enough to fill the GPU of `residency`
// in one wave, bounded (see attn2_host.cc). On an H200: 7 at TP8 (KVH 2), 7
// at TP4, 2 at TP1.
int attn2_splits(int max_model_len, int window, int num_kv_heads, const Attn2Residency& residency);
// The same for the current CUDA device: its measured residency (prepare_attn2
// runs on it first where it has not), or kH200Attn2Residency on a host
// without a supported GPU.
int attn2_splits(int max_model_len, int window, int num_kv_heads);

// Bytes of the split kernel's workspace (counters and per-slice partials); 0
// when num_splits is 1. The caller zeroes it once when allocating it; every
// launch leaves it ready (all of it back at 0) for the next one.
int64_t attn2_workspace_bytes(int num_reqs, int num_kv_heads, int num_splits);

// One-time setup for CUDA device `device` (-1: the current one): kernel
// attributes (dynamic shared memory, clusters of 16 CTAs) and the residency
// the launches are sized by. Call it outside graph capture, before the first
// call on that device. Throws std::invalid_argument on a GPU the kernels were
// not built for (or a device that is not there) and std::runtime_error when
// the CUDA runtime refuses the attributes.
//
// With MUSE_DECODE_ATTN2_MAX_CLUSTER=8 in the environment, every launch on
// the device uses clusters of 8 CTAs instead of 16 (the path of GPUs that
// cannot place a cluster of 16; the same results to the tolerance, not to
// the bit). For compute-sanitizer's synccheck, which faults kernels launched
// with more than 4 clusters of 16 (docs/sanitizers.md). Any other value than
// 8 or 16 throws std::invalid_argument naming the variable.
void prepare_attn2(int device = -1);

// What prepare_attn2(device) measured. Throws std::invalid_argument before it.
Attn2Residency attn2_residency(int device = -1);

// ---------------------------------------------------------------------------
// The layer attributes attn2 depends on (what vLLM's MuseSpark1xAttention carries).
struct Attn2Layer {
  bool use_o_norm = true;                   // weightless RMS norm of the attention output
  bool use_o_gate = true;                   // sigmoid gate of the attention output
  int head_dim = kHeadDim;
  int num_heads = 2 * kHeadsPerKvHead;      // query heads of this rank
  int num_kv_heads = 2;                     // KV heads of this rank
  double scaling = kSoftmaxScale;           // softmax scale
  double rms_norm_eps = kRmsNormEps;        // o-norm eps
};

// Why attn2 cannot compute this layer, or nullopt when it can.
std::optional<std::string> unsupported_attn2(const Attn2Layer& layer);

// ---------------------------------------------------------------------------
// One call. R requests of 8 query rows each; H = 8 * KVH query heads.
struct Attn2Args {
  TensorRef q;            // bf16 [R*8, H*64], unit column stride, row stride % 8 == 0, 16-byte aligned
  TensorRef gate;         // bf16 [R*8, H*64], same layout rules as q (its own row stride)
  TensorRef kv_cache;     // bf16 [pages, KVH, 16, 128] contiguous (K in 0:64, V in 64:128), KVH in [1, 16]
  TensorRef block_table;  // int32 [R, max_pages], unit column stride, max_pages >= ceil(max_model_len / 16)
  TensorRef seq_lens;     // int32 [R], contiguous: 8 <= L <= max_model_len, the 8 query tokens included
  TensorRef out;          // bf16 [R*8, H*64], same layout rules as q; must not overlap any input
  TensorRef workspace;    // attn2_workspace_bytes(R, KVH, num_splits) bytes, contiguous, 16-byte aligned;
                          // may be absent when num_splits == 1
  int max_model_len = 0;  // of the deployment: sizes the grid and bounds L
  int window = 0;         // attn2_window(layer's sliding window, max_model_len); 0 = none
  int num_splits = 1;     // attn2_splits(max_model_len, window, KVH), or any value in [1, 32]
  bool pdl = true;        // launch with programmatic dependent launch (see below)
};
// With pdl the kernel may start while the kernel before it still runs. Before
// its griddepcontrol.wait it reads only seq_lens, block_table and the cached
// keys older than each request's 8 new ones (positions < L - 8), and copies
// some of those pages; q, gate, the 8 new keys (qkv_front's insert) and everything
// written come after the wait. So the kernel before attn2 must not write
// seq_lens, block_table or older keys, nor, if it lets its dependents start
// before its own wait (qkv_front does, at its start), may the kernel before
// that one. A step writes none of them.

// Why attn2 does not take this call (the argument, the expected and the
// actual value), or nullopt when it does. The same text check_attn2 throws.
std::optional<std::string> unsupported_attn2_call(const Attn2Args& args);

// Checks every argument (std::invalid_argument naming it, with the expected
// and the actual value); launches nothing and needs no GPU.
void check_attn2(const Attn2Args& args);

// check_attn2, then the launch on `stream`. Throws std::invalid_argument on bad
// arguments or a device prepare_attn2 has not set up, std::runtime_error on a
// launch error. Allocates nothing, never synchronises.
void attn2(const Attn2Args& args, Stream stream);

// attn2 bound to a layer's KV cache and workspace and the deployment's sizes:
// the constructor validates them once (std::invalid_argument naming the
// argument) and prepares the cache's device; a call passes the step's tensors
// and runs attn2() (every check still runs on every call). The bound views
// must stay valid: bind again after replacing one.
class Attn2 {
 public:
  Attn2(const TensorRef& kv_cache, const TensorRef& workspace, int max_model_len, int window, int num_splits);

  void operator()(const TensorRef& q, const TensorRef& gate, const TensorRef& block_table, const TensorRef& seq_lens,
                  const TensorRef& out, Stream stream, bool pdl = true) const;

  // The Attn2Args of one call (what operator() passes to attn2()).
  Attn2Args args(const TensorRef& q, const TensorRef& gate, const TensorRef& block_table,
                 const TensorRef& seq_lens, const TensorRef& out, bool pdl = true) const;

 private:
  TensorRef kv_cache_, workspace_;
  int max_model_len_, window_, num_splits_;
};

}  // namespace muse_decode
