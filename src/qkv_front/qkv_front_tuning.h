// qkv_front timing knobs (bench/bench_qkv_front.cu --variants); not part of
// the public API. Zero means "the library's choice" everywhere, which is what
// every caller other than the benchmark gets.
#pragma once

namespace muse_decode::qkv_front_tuning {

struct Tuning {
  int path = 0;               // 0: dispatch table; 1: stream-K kernel; 2: cluster kernel (1 <= KV heads <= 2)
  int cluster_ctas = 0;       // cluster kernel: CTAs per head (2 or 3)
  int owner_blocks = 0;       // cluster kernel: 64-column blocks of K the head's owner (rank 0) streams
  int pre_stages = 0;         // cluster kernel: ring stages issued before griddepcontrol.wait
  int streamk_pre_stages = 0; // stream-K kernel: the same
};

void set(const Tuning& t);
Tuning get();
// cudaOccupancyMaxActiveClusters of the cluster kernel (nt n-tiles) for
// clusters of `ctas` CTAs on the current device; negative: the CUDA error.
int max_active_clusters(int nt, int ctas);

}  // namespace muse_decode::qkv_front_tuning
