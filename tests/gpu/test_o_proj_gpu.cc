// GPU tests of o_proj against the fp64 CPU reference from the same bf16
// inputs: relative RMS error <= 5e-3 per token row (and per 64 output
// columns), no NaN or Inf, for odd token counts from 1 to 64 (1, 3, 7, 8, 9,
// 17, 31, 33, 63, 64: every n-tile count and both edges of each) at every
// input width (TP16 .. TP1, TP8 and TP1 at every count); x and out strided
// (NaN in x's row padding: never read), out poisoned and every element
// outside [T, 8192] checked untouched; with and without PDL, the same bits;
// the same bits over repeated runs; a chain of two PDL launches in which the
// second reads the first's out as x; graph capture, then replay with new x;
// the bound form and the unchecked launch; bad input refused with nothing
// launched.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "../cpu/check_util.h"
#include "gpu_util.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/reference/o_proj.h"
#include "o_proj/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

constexpr int kMaxT = md::kOProjMaxTokens;
constexpr int kOut = md::kOProjOutWidth;
constexpr int64_t kOutStride = kOut + 64;  // out rows with a row stride, as a column view would have
constexpr uint16_t kOutPoison = 0xFFFF;    // a bf16 NaN
constexpr uint16_t kXPadding = 0x7FC0;     // NaN in x's row padding
constexpr double kTolerance = 5e-3;
const int kTokenCounts[] = {1, 3, 7, 8, 9, 17, 31, 33, 63, 64};

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
};

// Runs f(i) for i in [0, n) on the host's cores.
template <typename F>
void parallel_for(int n, F&& f) {
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      for (int i = w; i < n; i += threads) f(i);
    });
  for (auto& t : pool) t.join();
}

// One layer of one input width: the weight, 64 rows of x (row stride K + 64),
// two outputs, and the fp64 projection of x for the reference.
struct Layer {
  int K;
  int64_t x_stride;
  Rng rng;
  std::vector<uint16_t> w_host, x_host;
  std::vector<double> y;  // [64, 8192]: x W^T in double
  DeviceBuffer<uint16_t> w, x, out, out2;
  cudaStream_t stream = nullptr;
  double worst = 0.0;

  explicit Layer(int kvh, uint64_t seed = 1)
      : K(md::o_proj_in_width(kvh)),
        x_stride(K + 64),
        rng{seed * 0x5851F42Dull + static_cast<uint64_t>(kvh)},
        w(static_cast<size_t>(kOut) * K),
        x(static_cast<size_t>(kMaxT) * (K + 64)),
        out((kMaxT + 1) * kOutStride),  // one row more than any call writes: checked untouched
        out2((kMaxT + 1) * kOutStride) {
    md::prepare_o_proj(0);
    // Weights of a realistic scale (1/sqrt(K) ~ 0.01..0.04); x in [-1, 1).
    w_host.resize(w.size());
    const uint64_t base = rng.next();
    parallel_for(64, [&](int part) {
      Rng r{base + 977ull * (part + 1)};
      for (size_t k = part; k < w_host.size(); k += 64) w_host[k] = md::reference::float_to_bf16_bits(0.03f * r.uniform());
    });
    w.upload(w_host);
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    new_x();
  }
  ~Layer() { cudaStreamDestroy(stream); }

  // Fresh x (NaN in the row padding) and its projection.
  void new_x() {
    x_host.assign(static_cast<size_t>(kMaxT) * x_stride, kXPadding);
    for (int t = 0; t < kMaxT; ++t)
      for (int k = 0; k < K; ++k) x_host[t * x_stride + k] = md::reference::float_to_bf16_bits(rng.uniform());
    x.upload(x_host);
    y.assign(static_cast<size_t>(kMaxT) * kOut, 0.0);
    parallel_for(kMaxT, [&](int t) {
      md::reference::o_proj_exact(&x_host[t * x_stride], x_stride, 1, w_host.data(), K, &y[static_cast<size_t>(t) * kOut]);
    });
  }

  TensorRef t_x(int T) const {
    TensorRef t = md::make_tensor(x.get(), DType::kBFloat16, {T, K});
    t.stride[0] = x_stride;
    return t;
  }
  TensorRef t_out(const DeviceBuffer<uint16_t>& o, int T) const {
    TensorRef t = md::make_tensor(o.get(), DType::kBFloat16, {T, kOut});
    t.stride[0] = kOutStride;
    return t;
  }
  TensorRef t_w() const { return md::make_tensor(w.get(), DType::kBFloat16, {kOut, K}); }

  void poison() {
    out.upload(std::vector<uint16_t>(out.size(), kOutPoison));
    out2.upload(std::vector<uint16_t>(out2.size(), kOutPoison));
  }

  md::OProjArgs args(int T, const DeviceBuffer<uint16_t>& o, bool pdl) const {
    md::OProjArgs a;
    a.x = t_x(T);
    a.weight = t_w();
    a.out = t_out(o, T);
    a.pdl = pdl;
    return a;
  }
  void call(int T, const DeviceBuffer<uint16_t>& o, bool pdl) {
    md::o_proj(args(T, o, pdl), reinterpret_cast<md::Stream>(stream));
  }

  // out (rows < T) against `ref` ([>= T, 8192] double), everything else untouched.
  void check_out(const char* what, int T, const std::vector<uint16_t>& o, const std::vector<double>& ref) {
    SCOPED_TRACE(::testing::Message() << what << " K=" << K << " T=" << T);
    for (int t = 0; t <= kMaxT; ++t)
      for (int64_t c = 0; c < kOutStride; ++c)
        if (t >= T || c >= kOut) {
          ASSERT_EQ(o[t * kOutStride + c], kOutPoison) << "written outside out: " << t << ", " << c;
        }
    for (int t = 0; t < T; ++t) {
      double row_err = 0.0, row_ref = 0.0;
      for (int g = 0; g < kOut / 64; ++g) {
        double err = 0.0, mag = 0.0;
        for (int d = 0; d < 64; ++d) {
          const int c = g * 64 + d;
          const float v = md::reference::bf16_bits_to_float(o[t * kOutStride + c]);
          ASSERT_TRUE(std::isfinite(v)) << "token " << t << " column " << c;
          const double r = ref[static_cast<size_t>(t) * kOut + c];
          err += (v - r) * (v - r);
          mag += r * r;
        }
        ASSERT_LE(std::sqrt(err / mag), kTolerance) << "token " << t << " columns " << g * 64 << "..";
        row_err += err;
        row_ref += mag;
      }
      const double rel = std::sqrt(row_err / row_ref);
      worst = std::max(worst, rel);
      ASSERT_LE(rel, kTolerance) << "token " << t;
    }
  }

  // One call of T tokens, checked; returns its out.
  std::vector<uint16_t> run_and_check(int T, bool pdl) {
    poison();
    call(T, out, pdl);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto o = out.download();
    check_out(pdl ? "single call, PDL" : "single call", T, o, y);
    return o;
  }
};

}  // namespace

// TP8 (K = 1024) and TP1 (K = 8192) at every listed T, with and without PDL
// (the same bits); the other widths at the n-tile edges.
TEST(OProjGpu, EveryTokenCountMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (int kvh : {2, 16, 1, 4, 8}) {
    Layer l(kvh);
    const bool all = kvh == 2 || kvh == 16;
    for (int T : kTokenCounts) {
      if (!all && T != 1 && T != 8 && T != 9 && T != 64) continue;
      const auto with_pdl = l.run_and_check(T, true);
      if (HasFatalFailure()) return;
      const auto without = l.run_and_check(T, false);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(with_pdl == without) << "K=" << l.K << " T=" << T << ": PDL on and off give different bits";
    }
    std::printf("[ o_proj ] K=%d: worst relative RMS error per token row %.3e (bar %.0e)\n", l.K, l.worst, kTolerance);
  }
}

TEST(OProjGpu, BitIdenticalOverRepeatedRuns) {
  SKIP_WITHOUT_GPU();
  for (int kvh : {2, 16})
    for (int T : {8, 64}) {
      SCOPED_TRACE(::testing::Message() << "kvh=" << kvh << " T=" << T);
      Layer l(kvh, 21);
      l.poison();
      std::vector<uint16_t> out0;
      for (int run = 0; run < 10; ++run) {
        l.call(T, l.out, run % 2 == 1);
        CUDA_OK(cudaStreamSynchronize(l.stream));
        auto o = l.out.download();
        if (run == 0) out0 = std::move(o);
        else ASSERT_TRUE(o == out0) << "out bits differ in run " << run;
      }
    }
}

// Two chained PDL launches: the second (TP1 weight, K = 8192) reads the
// first's out [T, 8192] as its x, so a read of x before the first kernel
// completes would show.
TEST(OProjGpu, ChainedLaunchReadsThePreviousOutput) {
  SKIP_WITHOUT_GPU();
  Layer first(2, 5), second(16, 6);
  for (int T : {8, 33}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    first.poison();
    second.poison();
    md::OProjArgs a = second.args(T, second.out, true);
    a.x = first.t_out(first.out, T);
    for (int rep = 0; rep < 3; ++rep) {
      first.call(T, first.out, true);
      md::o_proj(a, reinterpret_cast<md::Stream>(first.stream));
    }
    CUDA_OK(cudaStreamSynchronize(first.stream));
    const auto o1 = first.out.download();
    first.check_out("chain, first", T, o1, first.y);
    std::vector<double> ref(static_cast<size_t>(T) * kOut);
    parallel_for(T, [&](int t) {
      md::reference::o_proj_exact(&o1[t * kOutStride], kOutStride, 1, second.w_host.data(), second.K,
                                  &ref[static_cast<size_t>(t) * kOut]);
    });
    second.check_out("chain, second", T, second.out.download(), ref);
    if (HasFatalFailure()) return;
  }
}

// Capture two PDL launches (T = 8 and T = 64 into two outputs), then replay
// with new x written into the same buffer.
TEST(OProjGpu, GraphReplayWithNewInputs) {
  SKIP_WITHOUT_GPU();
  Layer l(2, 9);
  md::prepare_o_proj();     // outside capture (Layer's constructor did it too)
  l.call(8, l.out, false);  // an eager call first, as engines do
  CUDA_OK(cudaStreamSynchronize(l.stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(l.stream, cudaStreamCaptureModeGlobal));
  l.call(8, l.out, true);
  l.call(64, l.out2, true);
  CUDA_OK(cudaStreamEndCapture(l.stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    SCOPED_TRACE(::testing::Message() << "replay " << rep);
    if (rep > 0) l.new_x();
    l.poison();
    CUDA_OK(cudaGraphLaunch(exec, l.stream));
    CUDA_OK(cudaStreamSynchronize(l.stream));
    l.check_out("graph call 1", 8, l.out.download(), l.y);
    l.check_out("graph call 2", 64, l.out2.download(), l.y);
    if (HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The bound form (OProj) and the unchecked launch of check_o_proj's params
// write the bits the op writes.
TEST(OProjGpu, BoundFormAndUncheckedLaunchMatchTheOp) {
  SKIP_WITHOUT_GPU();
  Layer l(2, 27);
  const int T = 17;
  const auto st = reinterpret_cast<md::Stream>(l.stream);
  const md::OProjArgs a = l.args(T, l.out, true);
  l.poison();
  md::o_proj(a, st);
  CUDA_OK(cudaStreamSynchronize(l.stream));
  const auto out0 = l.out.download();
  l.check_out("op", T, out0, l.y);

  const md::OProj bound(a.weight);
  l.poison();
  bound(a.x, a.out, st);
  CUDA_OK(cudaStreamSynchronize(l.stream));
  ASSERT_TRUE(l.out.download() == out0) << "the bound form's out differs";

  l.poison();
  CUDA_OK(static_cast<cudaError_t>(md::o_proj_impl::launch(md::o_proj_impl::params_of(a), st)));
  CUDA_OK(cudaStreamSynchronize(l.stream));
  ASSERT_TRUE(l.out.download() == out0) << "the unchecked launch's out differs";
}

TEST(OProjGpu, BadInputLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  Layer l(2, 33);
  l.poison();
  const auto attempt = [&](const TensorRef& x, const TensorRef& out) {
    return md::testing::error_of([&] {
      md::OProjArgs a;
      a.x = x;
      a.weight = l.t_w();
      a.out = out;
      md::o_proj(a, reinterpret_cast<md::Stream>(l.stream));
    });
  };
  TensorRef x65 = l.t_x(64);
  x65.shape[0] = 65;
  TensorRef out65 = l.t_out(l.out, 64);
  out65.shape[0] = 65;
  EXPECT_EQ(attempt(x65, out65),
            "x must be [T, K] with 1 <= T <= 64 and K one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64), got "
            "[65, 1024]");
  TensorRef xbad = l.t_x(4);
  xbad.stride[0] = 1028;
  EXPECT_EQ(attempt(xbad, l.t_out(l.out, 4)),
            "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 1024), got row stride 1028");
  TensorRef over = l.t_out(l.out, 4);
  over.data = l.x.get();
  EXPECT_EQ(attempt(l.t_x(4), over), "out and x must not overlap in memory");
  CUDA_OK(cudaStreamSynchronize(l.stream));
  const auto o = l.out.download();
  for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o[i], kOutPoison) << "element " << i << " written";
}

// The small calls compute-sanitizer runs (scripts/sanitize.sh): the short-K
// kernels (TP8) at one and at eight n-tiles, the long-K ones (TP4) at two.
TEST(OProjGpu, SanitizerShortK) {
  SKIP_WITHOUT_GPU();
  Layer l(2);
  l.run_and_check(1, /*pdl=*/true);
  if (HasFatalFailure()) return;
  l.run_and_check(64, /*pdl=*/false);
}

TEST(OProjGpu, SanitizerLongK) {
  SKIP_WITHOUT_GPU();
  Layer l(4);
  l.run_and_check(9, /*pdl=*/true);
}
