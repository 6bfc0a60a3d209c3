// Timing by CUDA-graph replay, the muse-decode tool's and the C++
// benchmarks': the copy bandwidth the floors use, and time_graph: warm-up
// replays, then `replays` timed replays of a graph holding `calls` calls,
// each timed with events; the median (and minimum) in microseconds per call.
// `before_each` runs on the stream before every timed replay, outside the
// timed region (an L2 flush, say).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "device.h"

namespace muse_decode::support {

inline constexpr double kCopyBandwidth = 4.2e12;  // bytes/s, H200 device-to-device copy

struct GraphTiming {
  double median_us = 0;  // per call
  double min_us = 0;     // per call
};

template <typename BeforeEach>
GraphTiming time_graph(cudaGraphExec_t exec, cudaStream_t stream, int calls, int replays, BeforeEach&& before_each) {
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 2; ++i) cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  std::vector<double> us;
  for (int i = 0; i < replays; ++i) {
    before_each(stream);
    cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
    cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    cuda_ok(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    us.push_back(ms * 1000.0 / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front()};
}

inline GraphTiming time_graph(cudaGraphExec_t exec, cudaStream_t stream, int calls, int replays = 7) {
  return time_graph(exec, stream, calls, replays, [](cudaStream_t) {});
}

// A graph of call(0) .. call(calls - 1) captured and timed (`replays` replays).
template <typename Call, typename BeforeEach>
GraphTiming time_calls(cudaStream_t stream, int calls, int replays, Call&& call, BeforeEach&& before_each) {
  Graph g;
  capture(g, stream, calls, call);
  return time_graph(g.exec, stream, calls, replays, before_each);
}

template <typename Call>
GraphTiming time_calls(cudaStream_t stream, int calls, Call&& call) {
  return time_calls(stream, calls, 7, call, [](cudaStream_t) {});
}

}  // namespace muse_decode::support
