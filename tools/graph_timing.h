// Timing by CUDA-graph replay, the muse-decode tool's and the C++
// benchmarks' (which include it from tools/): the copy bandwidth the floors
// use, a CUDA check that exits, and time_graph: warm-up replays, then
// `replays` timed replays of a graph holding `calls` calls, each timed with
// events; the median (and minimum) in microseconds per call. `before_each`
// runs on the stream before every timed replay, outside the timed region (an
// L2 flush, say).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

// Exit with the file, line, expression and CUDA error when expr fails.
#define CUDA_CHECK_OR_EXIT(expr)                                                                     \
  do {                                                                                               \
    cudaError_t err_ = (expr);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

namespace muse_decode::timing {

inline constexpr double kCopyBandwidth = 4.2e12;  // bytes/s, H200 device-to-device copy

struct GraphTiming {
  double median_us = 0;  // per call
  double min_us = 0;     // per call
};

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

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

}  // namespace muse_decode::timing
