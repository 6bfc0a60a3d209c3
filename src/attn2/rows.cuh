// The rows of a (request, KV head) that each thread merges and finishes
// after the key loop, and the per-thread inputs that do not depend on the
// step's length: Q (each warp's share of its row block) and the gate of the
// thread's merged row.
#pragma once

#include "../common/ptx.cuh"
#include "config.cuh"
#include "params.h"

namespace muse_decode::attn2_impl {

// The rows a thread merges and finishes: rank r's kMergeRows rows, each on
// kRowThreads threads of the first half with kCols columns each: 32 threads
// with 2 columns where the first half has that many threads (clusters of 16:
// 4 rows per CTA), else 16 with 4. The work after the key loop is a chain of
// dependent latencies, and half the columns per thread shortens it.
template <int kCluster>
struct RowOwner {
  static constexpr int kMergeRows = kRows / kCluster;
  static constexpr int kRowThreads = kMergeRows * 32 <= kHalfThreads ? 32 : 16;
  static constexpr int kCols = kHeadDim / kRowThreads;
  // Clusters of 16 on the wgmma path push straight from the first half's
  // registers (each thread's 2 rows x 16 columns), not through an fp16 copy
  // of O in shared memory (one-slice kernels: window -0.04 us, max_model_len
  // 2048 -0.05; 2k -0.06). The receive area then holds two halves of n-tiles
  // (0-3, 4-7), each in the fragment's order (a warp instruction writes two
  // runs of 256 bytes), and the mergers map positions back to columns.
  static constexpr bool kRegPush = kWgmma && kCols == 2;
  static constexpr int kRecvHalfBytes = kRows * 32 * 2;  // (kRegPush) one half of n-tiles: 4 KB
  static_assert(kCluster == 8 || kCluster == 16, "clusters of 8 or 16");
  static_assert(kRows % kCluster == 0 && kMergeRows * 16 <= kHalfThreads,
                "each CTA of the cluster merges 64 / C rows, at least 16 threads per row, in its first half");
  static_assert(kRecvHalfBytes == kCluster * kMergeRows * 32 * 2, "the push's half stride");

  bool merger;  // this thread merges and finishes a row
  int row;      // head * 8 + token within the (request, KV head)'s 64
  int d;        // this thread's first position in the merged row (workspace, receive area)
  int dc;       // its first column: d, or (kRegPush) position 32h + 8q + 2j holds columns 8n + 2q, n = 4h + j

  __device__ __forceinline__ explicit RowOwner(int rank)
      : merger(threadIdx.x < kMergeRows * kRowThreads),
        row(rank * kMergeRows + threadIdx.x / kRowThreads),
        d((threadIdx.x % kRowThreads) * kCols),
        dc(kRegPush ? (4 * (d / 32) + d % 8 / 2) * 8 + d % 32 / 8 * 2 : d) {}
  __device__ __forceinline__ int token() const { return row % kVerifyLen; }
  __device__ __forceinline__ int head(int kvh) const { return kvh * kHeadsPerKvHead + row / kVerifyLen; }
  // This thread's kCols columns of its row in out.
  __device__ __forceinline__ __nv_bfloat16* out(const Params& p, int req, int kvh) const {
    return static_cast<__nv_bfloat16*>(p.out) + (static_cast<int64_t>(req) * kVerifyLen + token()) * p.out_stride +
           head(kvh) * kHeadDim + dc;
  }
};

// The 16-byte chunk j (0 or 1) of its row block's Q that this thread carries:
// row r of the block's 16 (head 2 rw + r / 8, token r % 8), chunk c of the
// row's 8. The block's two warps (halves kh) carry 64 chunks each.
struct QChunk {
  int r, c;
};
__device__ __forceinline__ QChunk q_chunk(int j, int kh, int lane) {
  const int idx = (kh * 2 + j) * 32 + lane;
  return {idx / 8, idx % 8};
}

// This thread's share of the inputs that do not depend on the step's length:
// 2 x 16 bytes of its row block's 16 Q rows (row rw * 16 + r: head 2 rw + r /
// 8, token r % 8; the block's two warps share them) and, for merger threads,
// the bf16 gate of its kCols columns. Located before griddepcontrol.wait
// (indices only), loaded after it (q and gate are the previous kernel's
// output), so that the loads leave at once after the wait.
template <int kCluster>
struct RowInputs {
  static constexpr int kCols = RowOwner<kCluster>::kCols;
  const uint4* q_at[2];
  const void* gate_at;
  uint4 q[2];
  uint2 gate;

  __device__ __forceinline__ void locate(const Params& p, const RowOwner<kCluster>& rows, int req, int kvh,
                                         int rw, int kh, int lane) {
    const int64_t grow = static_cast<int64_t>(req) * kVerifyLen + rows.token();
    gate_at = static_cast<const __nv_bfloat16*>(p.gate) + grow * p.gate_stride + rows.head(kvh) * kHeadDim + rows.dc;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const QChunk q = q_chunk(j, kh, lane);
      q_at[j] = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.q) +
                                               static_cast<int64_t>(req * kVerifyLen + q.r % 8) * p.q_stride +
                                               (kvh * kHeadsPerKvHead + 2 * rw + q.r / 8) * kHeadDim + q.c * 8);
    }
  }
  __device__ __forceinline__ void load(bool merger) {
    gate = make_uint2(0u, 0u);
    if (merger) {
      if constexpr (kCols == 4)
        gate = *static_cast<const uint2*>(gate_at);
      else
        gate.x = *static_cast<const uint32_t*>(gate_at);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) q[j] = *q_at[j];
  }
};

}  // namespace muse_decode::attn2_impl
