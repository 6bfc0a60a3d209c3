// Host-side CUDA for the programs beside the library (the muse-decode tool,
// the benchmarks, examples/engine_step): the error checks, a typed device
// buffer, a stream, and a graph captured from a stream. Over the CUDA
// runtime alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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

namespace muse_decode::support {

// Throws std::runtime_error with `what` and the CUDA error when err is one.
inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// n values of T in device memory (64 bytes more are allocated past them),
// freed with the buffer.
template <typename T>
struct Device {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T) + 64), "cudaMalloc");
  }
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  // Synchronizes the device: a pageable upload may still be in flight when
  // cudaMemcpy returns, and the programs' streams are non-blocking (not
  // ordered after the legacy stream).
  void upload(const std::vector<T>& h, size_t offset = 0) const {
    cuda_ok(cudaMemcpy(ptr + offset, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  std::vector<T> download(size_t count, size_t offset = 0) const {
    std::vector<T> h(count);
    cuda_ok(cudaMemcpy(h.data(), ptr + offset, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

// A stream that is not ordered after the legacy stream (the one an engine's
// work runs on), destroyed with it.
struct NonBlockingStream {
  cudaStream_t s = nullptr;
  NonBlockingStream() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~NonBlockingStream() { cudaStreamDestroy(s); }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
  operator cudaStream_t() const { return s; }
};

// An instantiated graph of `calls` calls, destroyed with it.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  int calls = 0;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// Captures call(0) .. call(calls - 1), as enqueued on `stream`, into g.
template <typename Call>
void capture(Graph& g, cudaStream_t stream, int calls, Call&& call) {
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < calls; ++i) call(i);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  const cudaError_t err = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  cuda_ok(err, "cudaGraphInstantiate");
  g.calls = calls;
}

}  // namespace muse_decode::support
