// The main job's two halves: the verify step on the GPU (fused ops checked
// against the CPU reference and timed beside the unfused path), and the CPU
// reference path on a small shape for machines without a supported GPU.
#pragma once

#include <string>
#include <vector>

namespace muse_decode::tool {

struct Deployment {
  int tp = 8;               // tensor/expert-parallel size: this rank has 16/tp KV heads, 256/tp experts
  int context = 32768;      // keys per request (the step's 8 tokens included); also max_model_len
  int requests = 1;         // requests in the step, 8 tokens each
  bool sliding = true;      // a sliding-window (2048) RoPE layer, or a full-attention NoPE layer
  int layers = 0;           // weight/cache copies rotated through (0: enough to exceed the L2 3x)
  int tile_n = 128;         // GEMM tile of the routing metadata
  int calls = 0;            // calls per CUDA graph (0: chosen per op)
  int replays = 7;          // timed replays; the median is reported
  bool progress = true;     // progress lines on stderr
};

struct OpResult {
  std::string op;
  bool pass = false;
  std::string detail;       // what was checked and how far it was from the reference
  double us = 0;            // per call, L2 flushed before each replay
  double bytes = 0;         // that must move per call
  double floor_us = 0;      // bytes / 4.2 TB/s
  double unfused_us = 0;    // cuBLAS + plain kernels, same inputs, same run
  std::string skipped;      // why the row did not run (empty: it ran); pass says whether that is a failure
                            // (an op whose check refuses the deployment is not)
};

// Runs the step on the current GPU (throws std::runtime_error on CUDA errors).
std::vector<OpResult> run_gpu(const Deployment& d);

// The CPU reference path on a small shape: each op's reference against
// direct formulas. Never touches a GPU.
std::vector<OpResult> run_cpu();

}  // namespace muse_decode::tool
