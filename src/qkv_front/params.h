// qkv_front's device layer as the host layer, the tools, the tests and the
// benchmarks reach it (through the internal include folder src/): the kernel
// parameters, those of a checked call, the unchecked launch and the one-time
// setup. The kernels are defined in qkv_front.cu; a build without CUDA
// answers their entries with kCudaErrorNotSupported (qkv_front_host.cc).
#pragma once

#include <cstdint>
#include <string_view>

#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace muse_decode {
struct QkvFrontArgs;
}  // namespace muse_decode

namespace muse_decode::qkv_front_impl {

// Work decomposition (the kernel and the workspace sizing share it).
//
// The weight [N, 8192] is cut into blocks of 64 rows (one head) x 64 columns
// (8 KB, one TMA box). Blocks are numbered tile-major (tile = head, then K);
// CTA c of G owns blocks [c * B / G, (c + 1) * B / G) of the B blocks
// (stream-K), so every CTA reads the same bytes to within one block. A tile cut
// between CTAs is summed by the last of them to arrive, in CTA (= K) order.
inline constexpr int kFrontTileRows = kHeadDim;                   // 64 rows: one head
inline constexpr int kFrontBlockK = 64;                           // 64 bf16 = 128 B per row
inline constexpr int kFrontBlocksPerTile = kHiddenSize / kFrontBlockK;  // 128
// One CTA's partial sums of one tile: 128 threads x 2 n-tiles x 4 floats.
inline constexpr int kFrontPartialBytes = 128 * 2 * 4 * 4;        // 4 KB

// The kernel's parameters: every field is filled by params_of() alone.
struct Params {
  const void* x = nullptr;            // bf16 [num_tokens, 8192]; 16-byte aligned
  int64_t x_stride = kHiddenSize;     // elements between rows of x, multiple of 8
  const void* weight = nullptr;       // bf16 [N, 8192] contiguous; 16-byte aligned
  const int64_t* positions = nullptr; // [num_tokens]
  const float* cos_sin = nullptr;     // fp32 [max_pos, 64]; null: no RoPE
  int64_t max_pos = 0;                // rows of cos_sin
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; slots outside [0, num_slots): no insert
  void* kv_cache = nullptr;           // bf16 [pages, num_kv_heads, 16, 128] contiguous
  int64_t num_slots = 0;              // pages * 16
  void* out = nullptr;                // bf16 [num_tokens, N]
  int64_t out_stride = 0;             // elements between rows of out, multiple of 8
  void* workspace = nullptr;          // qkv_front_workspace_bytes(num_kv_heads, num_ctas's SMs), zeroed once
  int num_tokens = 0;                 // 1..16
  int num_kv_heads = 0;               // 1, 2, 4, 8 or 16
  int num_ctas = 0;                   // qkv_front_ctas(num_kv_heads, sm_count)
  bool pdl = false;                   // launch with programmatic dependent launch
};

// Checks every argument of a call, out and workspace included
// (std::invalid_argument naming it), and returns the kernel's parameters
// (the grid that of the device's multiprocessor count, 1 where there is
// none). Launches nothing and needs no GPU.
Params params_of(const QkvFrontArgs& args);

// The checks of the front's tensors (std::invalid_argument naming the
// argument), on CUDA device `device` (< 0: the tensor decides it), which
// attention_block shares: the weight bf16 [qkv_width(num_kv_heads), 8192]
// contiguous and 16-byte aligned, named `name`; cos_sin fp32 [max_pos, 64]
// contiguous and 16-byte aligned, or absent; the cache bf16
// [pages, num_kv_heads, 16, 128] contiguous and 16-byte aligned.
void check_weight(const TensorRef& weight, std::string_view name, int num_kv_heads, int device);
void check_cos_sin(const TensorRef& cos_sin, int device);
void check_cache(const TensorRef& kv_cache, int num_kv_heads, int device);

// Enqueues the kernel the dispatch table picks for p; no argument checks.
// Returns the CUDA error as int.
int launch(const Params& p, Stream stream);

// Sets every qkv_front kernel's attributes on the current device (dynamic
// shared memory) and checks the driver's tensor-map encoder. Returns the CUDA
// error as int.
int set_kernel_attributes();

}  // namespace muse_decode::qkv_front_impl
