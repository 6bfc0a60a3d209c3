// GPU tests of qkv_front against the fp64 CPU reference from the same bf16
// inputs: relative RMS error <= 5e-3 per token and head, no NaN or Inf, for
// every T from 1 to 16, KV heads 1, 2, 4, 8 and 16, RoPE and NoPE layers,
// positions up to the table's last row; the KV cache bit-equal to out's k and
// v at the given slots and untouched elsewhere (slots -1 and outside the
// cache write nothing); out's padding untouched; graph capture then replay
// with new inputs (two chained PDL launches sharing a workspace); the same
// bits over 10 runs; bad input refused with nothing launched. Both kernels
// run: 2 KV heads take the cluster kernel, the other counts stream-K.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "../cpu/check_util.h"
#include "../cpu/check_util.h"
#include "gpu_util.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/reference/qkv_front.h"
#include "qkv_front/params.h"

namespace md = muse_decode;
using md::DType;
using md::TensorRef;

namespace {

constexpr int64_t kXStride = 8192 + 64;  // x rows with a row stride, as a column view would have
constexpr int kMaxPos = 4096;
constexpr int kPages = 64;
constexpr uint16_t kOutPoison = 0xFFFF;    // a bf16 NaN
constexpr uint16_t kCachePoison = 0xFFC1;  // another NaN, so cache and out poison differ
constexpr double kTolerance = 5e-3;


std::vector<float> rope_table() {
  std::vector<float> t(static_cast<size_t>(kMaxPos) * 64);
  for (int p = 0; p < kMaxPos; ++p)
    for (int j = 0; j < 32; ++j) {
      const double inv_freq = std::pow(md::kRopeTheta, -2.0 * j / 64.0);
      t[p * 64 + j] = static_cast<float>(std::cos(p * inv_freq));
      t[p * 64 + 32 + j] = static_cast<float>(std::sin(p * inv_freq));
    }
  return t;
}

// One layer of one KV-head count: the weight, 16 tokens of x, the buffers of
// a call and the fp64 projection of x for the reference.
struct Front {
  int kvh, n;
  int64_t out_stride;
  SplitMix rng;
  std::vector<uint16_t> w_host, x_host;
  std::vector<float> table = rope_table();
  std::vector<double> y_proj;  // [16, n]
  DeviceBuffer<uint16_t> w, x, out, out2, cache;
  DeviceBuffer<int64_t> pos, slots, pos2, slots2;
  DeviceBuffer<float> cs;
  DeviceBuffer<int32_t> ws;
  cudaStream_t stream = nullptr;
  double worst = 0.0;

  explicit Front(int kv_heads, uint64_t seed = 1)
      : kvh(kv_heads),
        n(md::qkv_width(kv_heads)),
        out_stride(n + 64),
        rng{seed * 0x1234567ull + static_cast<uint64_t>(kv_heads)},
        w(static_cast<size_t>(n) * 8192),
        x(16 * kXStride),
        out(16 * (n + 64)),
        out2(16 * (n + 64)),
        cache(static_cast<size_t>(kPages) * kv_heads * 16 * 128),
        pos(16),
        slots(16),
        pos2(16),
        slots2(16),
        cs(static_cast<size_t>(kMaxPos) * 64),
        ws(static_cast<size_t>(md::qkv_front_workspace_bytes_for_device(kv_heads, 0) / 4)) {
    md::prepare_qkv_front(0);
    w_host.resize(w.size());
    // Weights of a realistic scale (1/sqrt(8192) ~ 0.011); x in [-1, 1).
    const int threads = 16;
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
      pool.emplace_back([this, i, threads] {
        SplitMix r{rng.s + 977ull * (i + 1)};
        for (size_t k = i; k < w_host.size(); k += threads)
          w_host[k] = md::reference::float_to_bf16_bits(0.02f * r.uniform());
      });
    for (auto& t : pool) t.join();
    w.upload(w_host);
    cs.upload(table);
    cudaMemset(ws.get(), 0, ws.size() * 4);  // zeroed once; every launch leaves it ready
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    new_x();
  }
  ~Front() { cudaStreamDestroy(stream); }

  // Fresh x (NaN in the row padding: the kernel must never read it) and its projection.
  void new_x() {
    x_host.assign(16 * kXStride, 0x7FC0);
    for (int t = 0; t < 16; ++t)
      for (int k = 0; k < 8192; ++k) x_host[t * kXStride + k] = md::reference::float_to_bf16_bits(rng.uniform());
    x.upload(x_host);
    y_proj.assign(16 * static_cast<size_t>(n), 0.0);
    std::vector<std::thread> pool;
    for (int t = 0; t < 16; ++t)
      pool.emplace_back([this, t] {
        md::reference::qkv_projection(&x_host[t * kXStride], kXStride, 1, w_host.data(), kvh, &y_proj[t * n]);
      });
    for (auto& th : pool) th.join();
  }

  // Positions: the table's last row for token 0, random rows for the rest.
  std::vector<int64_t> new_positions(int T) {
    std::vector<int64_t> p(T);
    for (int t = 0; t < T; ++t) p[t] = t == 0 ? kMaxPos - 1 : rng.below(kMaxPos);
    if (T > 1) p[1] = 0;
    return p;
  }
  // Distinct slots in scattered pages, about a quarter of them -1 (pad tokens);
  // `avoid` slots are not used (another call's).
  std::vector<int64_t> new_slots(int T, const std::vector<int64_t>& avoid = {}) {
    std::vector<int64_t> all(kPages * 16);
    std::iota(all.begin(), all.end(), 0);
    for (int i = static_cast<int>(all.size()) - 1; i > 0; --i) std::swap(all[i], all[rng.below(i + 1)]);
    std::vector<int64_t> s;
    for (int64_t v : all) {
      if (static_cast<int>(s.size()) == T) break;
      if (std::find(avoid.begin(), avoid.end(), v) == avoid.end()) s.push_back(v);
    }
    for (int t = 1; t < T; ++t)
      if (rng.below(4) == 0) s[t] = -1;
    return s;
  }

  TensorRef t_x(int T) const {
    TensorRef t = md::make_tensor(x.get(), DType::kBFloat16, {T, 8192});
    t.stride[0] = kXStride;
    return t;
  }
  TensorRef t_out(const DeviceBuffer<uint16_t>& o, int T) const {
    TensorRef t = md::make_tensor(o.get(), DType::kBFloat16, {T, n});
    t.stride[0] = out_stride;
    return t;
  }
  TensorRef t_w() const { return md::make_tensor(w.get(), DType::kBFloat16, {n, 8192}); }
  TensorRef t_cs(bool rope) const {
    return rope ? md::make_tensor(cs.get(), DType::kFloat32, {kMaxPos, 64}) : TensorRef{};
  }
  TensorRef t_cache() const { return md::make_tensor(cache.get(), DType::kBFloat16, {kPages, kvh, 16, 128}); }
  TensorRef t_ws() const { return md::make_tensor(ws.get(), DType::kInt32, {static_cast<int64_t>(ws.size())}); }

  void poison() {
    out.upload(std::vector<uint16_t>(out.size(), kOutPoison));
    out2.upload(std::vector<uint16_t>(out2.size(), kOutPoison));
    cache.upload(std::vector<uint16_t>(cache.size(), kCachePoison));
  }

  md::QkvFrontArgs args(int T, bool rope, const DeviceBuffer<uint16_t>& o, const DeviceBuffer<int64_t>& p,
                       const DeviceBuffer<int64_t>& s, bool pdl) const {
    md::QkvFrontArgs a;
    a.x = t_x(T);
    a.weight = t_w();
    a.positions = md::make_tensor(p.get(), DType::kInt64, {T});
    a.cos_sin = t_cs(rope);
    a.slot_mapping = md::make_tensor(s.get(), DType::kInt64, {T});
    a.kv_cache = t_cache();
    a.num_kv_heads = kvh;
    a.out = t_out(o, T);
    a.workspace = t_ws();
    a.pdl = pdl;
    return a;
  }

  void call(int T, bool rope, const DeviceBuffer<uint16_t>& o, const DeviceBuffer<int64_t>& p,
            const DeviceBuffer<int64_t>& s, bool pdl) {
    md::qkv_front(args(T, rope, o, p, s, pdl), reinterpret_cast<md::Stream>(stream));
  }

  // out (rows < T) against the reference, its padding untouched, and the
  // cache rows of `slots` equal to out's k and v bits. Adds the expected cache
  // rows to `expect_cache`.
  void check_out(const char* what, int T, bool rope, const std::vector<uint16_t>& o,
                 const std::vector<int64_t>& positions, const std::vector<int64_t>& slot_list,
                 std::vector<uint16_t>& expect_cache) {
    SCOPED_TRACE(::testing::Message() << what << " kvh=" << kvh << " T=" << T << (rope ? " rope" : " nope"));
    std::vector<double> y(y_proj.begin(), y_proj.begin() + static_cast<size_t>(T) * n);
    md::reference::qkv_front_epilogue(y.data(), T, kvh, positions.data(), rope ? table.data() : nullptr, kMaxPos);
    for (int t = 0; t < 16; ++t)
      for (int64_t c = 0; c < out_stride; ++c)
        if (t >= T || c >= n) {
          ASSERT_EQ(o[t * out_stride + c], kOutPoison) << "written outside out: " << t << ", " << c;
        }
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < n / 64; ++h) {
        double err = 0.0, ref = 0.0;
        for (int d = 0; d < 64; ++d) {
          const float v = md::reference::bf16_bits_to_float(o[t * out_stride + h * 64 + d]);
          ASSERT_TRUE(std::isfinite(v)) << "token " << t << " head " << h << " dim " << d;
          const double r = y[static_cast<size_t>(t) * n + h * 64 + d];
          err += (v - r) * (v - r);
          ref += r * r;
        }
        const double rel = std::sqrt(err / ref);
        worst = std::max(worst, rel);
        ASSERT_LE(rel, kTolerance) << "token " << t << " head " << h;
      }
    const int q_heads = 8 * kvh;
    for (int t = 0; t < T; ++t) {
      const int64_t slot = slot_list[t];
      if (slot < 0 || slot >= kPages * 16) continue;
      for (int j = 0; j < kvh; ++j) {
        uint16_t* row = &expect_cache[(((slot / 16) * kvh + j) * 16 + slot % 16) * 128];
        for (int d = 0; d < 64; ++d) {
          row[d] = o[t * out_stride + (q_heads + j) * 64 + d];
          row[64 + d] = o[t * out_stride + (q_heads + kvh + j) * 64 + d];
        }
      }
    }
  }

  void check_cache(const std::vector<uint16_t>& expect) {
    const auto got = cache.download();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], expect[i]) << "cache element " << i << " (page " << i / (kvh * 16 * 128) << ", row "
                                   << (i / 128) % 16 << ", col " << i % 128 << ")";
  }

  // One call of T tokens from fresh positions and slots, checked.
  void run_and_check(int T, bool rope, bool pdl) {
    poison();
    const auto p = new_positions(T);
    const auto s = new_slots(T);
    pos.upload(p);
    slots.upload(s);
    call(T, rope, out, pos, slots, pdl);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint16_t> expect(cache.size(), kCachePoison);
    check_out("single call", T, rope, out.download(), p, s, expect);
    check_cache(expect);
  }
};

}  // namespace

TEST(QkvFrontGpu, EveryTokenCountAndHeadCountMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (int kvh : {1, 2, 4, 8, 16}) {
    Front f(kvh);
    for (int T = 1; T <= 16; ++T)
      for (bool rope : {true, false}) {
        f.run_and_check(T, rope, /*pdl=*/T % 2 == 0);
        if (HasFatalFailure()) return;
      }
    std::printf("[ qkv_front ] kvh=%d: worst relative RMS error per token and head %.3e (bar %.0e)\n", kvh,
                f.worst, kTolerance);
  }
}

// Slots outside the cache and -1 write nothing; positions past the table's
// end clamp to its last row, as the reference says.
TEST(QkvFrontGpu, PadSlotsAndOutOfRangeValues) {
  SKIP_WITHOUT_GPU();
  Front f(2, 5);
  const int T = 6;
  f.poison();
  const std::vector<int64_t> p = {0, kMaxPos - 1, kMaxPos, kMaxPos + 1000, -5, 77};
  const std::vector<int64_t> s = {-1, kPages * 16, kPages * 16 + 12345, 3, kPages * 16 - 1, -1};
  f.pos.upload(p);
  f.slots.upload(s);
  f.call(T, true, f.out, f.pos, f.slots, false);
  CUDA_OK(cudaStreamSynchronize(f.stream));
  std::vector<uint16_t> expect(f.cache.size(), kCachePoison);
  f.check_out("pad slots", T, true, f.out.download(), p, s, expect);
  f.check_cache(expect);
}

// Capture two chained PDL launches (T = 8 then T = 16, one workspace), then
// replay with new x, positions and slots written into the same buffers.
TEST(QkvFrontGpu, GraphReplayWithNewInputs) {
  SKIP_WITHOUT_GPU();
  Front f(2, 9);
  md::prepare_qkv_front();                         // outside capture (Front's constructor did it too)
  f.call(8, true, f.out, f.pos, f.slots, false);  // an eager call first, as engines do
  CUDA_OK(cudaStreamSynchronize(f.stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal));
  f.call(8, true, f.out, f.pos, f.slots, true);
  f.call(16, false, f.out2, f.pos2, f.slots2, true);
  CUDA_OK(cudaStreamEndCapture(f.stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 4; ++rep) {
    SCOPED_TRACE(::testing::Message() << "replay " << rep);
    if (rep > 0) f.new_x();
    f.poison();
    const auto p1 = f.new_positions(8), p2 = f.new_positions(16);
    const auto s1 = f.new_slots(8);
    const auto s2 = f.new_slots(16, s1);
    f.pos.upload(p1);
    f.slots.upload(s1);
    f.pos2.upload(p2);
    f.slots2.upload(s2);
    CUDA_OK(cudaGraphLaunch(exec, f.stream));
    CUDA_OK(cudaStreamSynchronize(f.stream));
    std::vector<uint16_t> expect(f.cache.size(), kCachePoison);
    f.check_out("graph call 1", 8, true, f.out.download(), p1, s1, expect);
    f.check_out("graph call 2", 16, false, f.out2.download(), p2, s2, expect);
    f.check_cache(expect);
    if (HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(QkvFrontGpu, BitIdenticalOverTenRunsAndWorkspaceLeftReady) {
  SKIP_WITHOUT_GPU();
  for (int kvh : {2, 16})
    for (int T : {8, 16}) {
      SCOPED_TRACE(::testing::Message() << "kvh=" << kvh << " T=" << T);
      Front f(kvh, 21);
      f.poison();
      f.pos.upload(f.new_positions(T));
      f.slots.upload(f.new_slots(T));
      std::vector<uint16_t> out0, cache0;
      for (int run = 0; run < 10; ++run) {
        f.call(T, true, f.out, f.pos, f.slots, run % 2 == 1);
        CUDA_OK(cudaStreamSynchronize(f.stream));
        auto o = f.out.download();
        auto c = f.cache.download();
        if (run == 0) {
          out0 = std::move(o);
          cache0 = std::move(c);
        } else {
          ASSERT_TRUE(o == out0) << "out bits differ in run " << run;
          ASSERT_TRUE(c == cache0) << "cache bits differ in run " << run;
        }
      }
      // Every arrival counter is back at zero.
      const auto words = f.ws.download();
      for (int t = 0; t < f.n / 64; ++t) ASSERT_EQ(words[t], 0) << "counter of tile " << t;
    }
}

// The bound form (QkvFront) and the unchecked launch of check_qkv_front's
// params write the bits the op writes.
TEST(QkvFrontGpu, BoundFormAndUncheckedLaunchMatchTheOp) {
  SKIP_WITHOUT_GPU();
  for (int kvh : {2, 16}) {
    SCOPED_TRACE(::testing::Message() << "kvh=" << kvh);
    Front f(kvh, 27);
    const int T = 8;
    f.poison();
    f.pos.upload(f.new_positions(T));
    f.slots.upload(f.new_slots(T));
    const auto st = reinterpret_cast<md::Stream>(f.stream);
    const md::QkvFrontArgs a = f.args(T, true, f.out, f.pos, f.slots, true);
    md::qkv_front(a, st);
    CUDA_OK(cudaStreamSynchronize(f.stream));
    const auto out0 = f.out.download(), cache0 = f.cache.download();

    const md::QkvFront bound(a.weight, a.cos_sin, a.kv_cache, kvh, a.workspace);
    f.poison();
    bound(a.x, a.positions, a.slot_mapping, a.out, st);
    CUDA_OK(cudaStreamSynchronize(f.stream));
    ASSERT_TRUE(f.out.download() == out0) << "the bound form's out differs";
    ASSERT_TRUE(f.cache.download() == cache0) << "the bound form's cache differs";

    f.poison();
    CUDA_OK(static_cast<cudaError_t>(md::qkv_front_impl::launch(md::qkv_front_impl::params_of(a), st)));
    CUDA_OK(cudaStreamSynchronize(f.stream));
    ASSERT_TRUE(f.out.download() == out0) << "the unchecked launch's out differs";
    ASSERT_TRUE(f.cache.download() == cache0) << "the unchecked launch's cache differs";
  }
}

TEST(QkvFrontGpu, BadInputLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  Front f(2, 33);
  f.poison();
  f.pos.upload(f.new_positions(16));
  f.slots.upload(f.new_slots(16));
  const auto pos = [&](int T) { return md::make_tensor(f.pos.get(), DType::kInt64, {T}); };
  const auto slots = [&](int T) { return md::make_tensor(f.slots.get(), DType::kInt64, {T}); };
  const auto attempt = [&](const TensorRef& x, const TensorRef& cs, const TensorRef& out, const TensorRef& ws) {
    return md::testing::error_of([&] {
      const int T = static_cast<int>(out.shape[0]);
      md::QkvFrontArgs a;
      a.x = x;
      a.weight = f.t_w();
      a.positions = pos(T);
      a.cos_sin = cs;
      a.slot_mapping = slots(T);
      a.kv_cache = f.t_cache();
      a.num_kv_heads = 2;
      a.out = out;
      a.workspace = ws;
      md::qkv_front(a, reinterpret_cast<md::Stream>(f.stream));
    });
  };
  TensorRef x17 = f.t_x(16);
  x17.shape[0] = 17;
  TensorRef out17 = f.t_out(f.out, 16);
  out17.shape[0] = 17;
  EXPECT_EQ(attempt(x17, f.t_cs(true), out17, f.t_ws()), "x must be [T, 8192] with 1 <= T <= 16, got [17, 8192]");
  TensorRef xbad = f.t_x(4);
  xbad.stride[0] = 8192 + 4;
  EXPECT_EQ(attempt(xbad, f.t_cs(true), f.t_out(f.out, 4), f.t_ws()),
            "x rows must be 16-byte aligned (row stride a multiple of 8 elements, at least 8192), got row stride 8196");
  TensorRef xf = f.t_x(4);
  xf.dtype = DType::kFloat32;
  EXPECT_EQ(attempt(xf, f.t_cs(true), f.t_out(f.out, 4), f.t_ws()), "x must be bfloat16, got float32");
  const TensorRef cs32 = md::make_tensor(f.cs.get(), DType::kFloat32, {kMaxPos * 2, 32});
  EXPECT_EQ(attempt(f.t_x(4), cs32, f.t_out(f.out, 4), f.t_ws()),
            "cos_sin must be [max_pos, 64] with max_pos >= 1 (cos | sin), got [8192, 32]");
  TensorRef small_ws = f.t_ws();
  small_ws.shape[0] = 16;
  const std::string why = attempt(f.t_x(4), f.t_cs(true), f.t_out(f.out, 4), small_ws);
  EXPECT_EQ(why.rfind("workspace must be a contiguous 1-D buffer of at least ", 0), 0u) << why;
  EXPECT_NE(why.find("got [16] of int32, 64 bytes"), std::string::npos) << why;
  CUDA_OK(cudaStreamSynchronize(f.stream));
  for (uint16_t v : f.out.download()) ASSERT_EQ(v, kOutPoison) << "a refused call wrote out";
  for (uint16_t v : f.cache.download()) ASSERT_EQ(v, kCachePoison) << "a refused call wrote the cache";
}

// The small calls compute-sanitizer runs (scripts/sanitize.sh): each kernel
// with and without RoPE, at one and at two n-tiles of tokens.
TEST(QkvFrontGpu, SanitizerStreamK) {
  SKIP_WITHOUT_GPU();
  Front f(1);
  f.run_and_check(1, /*rope=*/true, /*pdl=*/false);
  if (HasFatalFailure()) return;
  f.run_and_check(9, /*rope=*/false, /*pdl=*/true);
}

TEST(QkvFrontGpu, SanitizerCluster) {
  SKIP_WITHOUT_GPU();
  Front f(2);
  f.run_and_check(1, /*rope=*/false, /*pdl=*/true);
  if (HasFatalFailure()) return;
  f.run_and_check(9, /*rope=*/true, /*pdl=*/false);
}
