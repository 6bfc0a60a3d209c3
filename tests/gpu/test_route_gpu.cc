// GPU tests of route against the CPU reference: ids exact where the keys are
// not within an ulp of each other (the host expf may differ from CUDA's by an
// ulp), weights to a few ulp, and the metadata field-identical to the
// reference built from the GPU's own ids. Bit-exactness against the contract's
// formula on the same GPU is tests/python/test_route_gpu.py (PyTorch).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "gpu_util.h"
#include "muse_decode/reference.h"
#include "muse_decode/route.h"
#include "route/params.h"

namespace md = muse_decode;
using md::DType;

namespace {

constexpr int kTiles[] = {8, 16, 32, 64, 128, 256};
constexpr int32_t kPoison = 0x7eadbeef;

struct Fixture {
  std::mt19937 rng{1234};
  std::vector<float> bias_host = std::vector<float>(256);
  DeviceBuffer<float> bias{256};
  DeviceBuffer<float> logits{8 * 256};
  DeviceBuffer<int32_t> ids{64};
  DeviceBuffer<float> weights{64};
  DeviceBuffer<int32_t> meta{static_cast<size_t>(md::metadata_size(256))};

  Fixture() {
    std::normal_distribution<float> n(0.0f, 0.02f);
    for (auto& b : bias_host) b = n(rng);
    bias.upload(bias_host);
  }
  md::MuseRouting routing() const {
    md::RouterDesc r;
    r.expert_bias = md::make_tensor(bias.get(), DType::kFloat32, {256});
    return md::MuseRouting(r);
  }
  std::vector<float> random_logits(int b, float sigma = 2.0f) {
    std::normal_distribution<float> n(0.0f, sigma);
    std::vector<float> x(b * 256);
    for (auto& v : x) v = n(rng);
    return x;
  }
  md::TensorRef t_logits(int b) const { return md::make_tensor(logits.get(), DType::kFloat32, {b, 256}); }
  md::TensorRef t_ids(int b) const { return md::make_tensor(ids.get(), DType::kInt32, {b, 8}); }
  md::TensorRef t_weights(int b) const { return md::make_tensor(weights.get(), DType::kFloat32, {b, 8}); }
};

// Sorted keys of one row in double: whether the top 8 are separated from the
// rest (and from each other) by more than a float ulp, so that a one-ulp
// score difference cannot reorder them.
bool well_separated(const float* x, const float* bias) {
  double key[256];
  for (int e = 0; e < 256; ++e) key[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(x[e]))) + bias[e];
  std::sort(key, key + 256, [](double a, double b) { return a > b; });
  for (int k = 0; k < 8; ++k)
    if (key[k] - key[k + 1] < 1e-6) return false;
  return true;
}

}  // namespace

TEST(RouteGpu, MatchesReferenceAndMetadataIsFieldExact) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const auto routing = f.routing();
  const int splits[][2] = {{0, 256}, {0, 32}, {96, 32}, {224, 32}, {77, 1}};
  int checked_rows = 0;
  for (int tile : kTiles)
    for (auto [off, n] : splits)
      for (int b = 1; b <= 8; ++b) {
        SCOPED_TRACE(::testing::Message() << "tile=" << tile << " off=" << off << " n=" << n << " b=" << b);
        auto x = f.random_logits(b);
        f.logits.upload(x);
        f.ids.fill_bytes(0xff);
        f.weights.fill_bytes(0xff);
        std::vector<int32_t> poison(f.meta.size(), kPoison);
        f.meta.upload(poison);
        md::RoutingMetadata m{md::make_tensor(f.meta.get(), DType::kInt32, {(int64_t)f.meta.size()}), off, n, tile};
        routing(f.t_logits(b), f.t_ids(b), f.t_weights(b), m, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        auto ids = f.ids.download();
        auto w = f.weights.download();
        auto meta = f.meta.download();
        std::vector<int32_t> ref_ids(b * 8);
        std::vector<float> ref_w(b * 8);
        md::reference::route(x.data(), b, f.bias_host.data(), 1.0f, ref_ids.data(), ref_w.data());
        for (int t = 0; t < b; ++t) {
          if (!well_separated(&x[t * 256], f.bias_host.data())) continue;
          ++checked_rows;
          for (int k = 0; k < 8; ++k) {
            ASSERT_EQ(ids[t * 8 + k], ref_ids[t * 8 + k]) << "t=" << t << " k=" << k;
            ASSERT_NEAR(w[t * 8 + k], ref_w[t * 8 + k], 4e-7f * std::fabs(ref_w[t * 8 + k]) + 1e-9f);
          }
        }
        for (int r = b * 8; r < 64; ++r) ASSERT_EQ(ids[r], -1) << "ids past b written";
        // Metadata: the reference from the GPU's ids, then every element of
        // the buffer (written or poisoned) must agree.
        std::vector<int32_t> ref(f.meta.size(), kPoison);
        md::reference::routing_metadata(ids.data(), b, off, n, tile, ref.data());
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(meta[i], ref[i]) << "metadata element " << i;
      }
  EXPECT_GT(checked_rows, 1000);
}

TEST(RouteGpu, TiesAndNaN) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  std::vector<float> zero(256, 0.0f);
  f.bias.upload(zero);
  const auto routing = f.routing();
  std::vector<float> x(8 * 256, -1.0f);
  for (int e : {40, 3, 250}) x[e] = 2.0f;                  // row 0: exact ties
  for (int e = 0; e < 256; ++e) x[256 + e] = 0.25f;        // row 1: all equal
  x[2 * 256 + 17] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN first
  x[2 * 256 + 5] = std::numeric_limits<float>::quiet_NaN();
  x[3 * 256 + 100] = std::numeric_limits<float>::infinity();
  x[3 * 256 + 101] = -std::numeric_limits<float>::infinity();
  f.logits.upload(x);
  routing(f.t_logits(4), f.t_ids(4), f.t_weights(4), std::nullopt, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto ids = f.ids.download();
  auto w = f.weights.download();
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 40);
  EXPECT_EQ(ids[2], 250);
  for (int k = 3; k < 8; ++k) EXPECT_EQ(ids[k], k - 3 + (k - 3 >= 3 ? 1 : 0));  // 0, 1, 2, 4, 5
  for (int k = 0; k < 8; ++k) EXPECT_EQ(ids[8 + k], k);
  EXPECT_EQ(ids[16], 5);
  EXPECT_EQ(ids[17], 17);
  for (int k = 0; k < 8; ++k) EXPECT_TRUE(std::isnan(w[16 + k]));
  EXPECT_EQ(ids[24], 100);
  EXPECT_FALSE(std::isnan(w[24]));
}

TEST(RouteGpu, GraphReplayWithNewLogitsAndDeterminism) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const auto routing = f.routing();
  md::RoutingMetadata m{md::make_tensor(f.meta.get(), DType::kInt32, {(int64_t)f.meta.size()}), 96, 32, 16};
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  f.logits.upload(f.random_logits(8));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  routing(f.t_logits(8), f.t_ids(8), f.t_weights(8), m, reinterpret_cast<md::Stream>(stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 5; ++rep) {
    auto x = f.random_logits(8);
    f.logits.upload(x);
    f.meta.upload(std::vector<int32_t>(f.meta.size(), kPoison));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    auto ids = f.ids.download();
    auto w = f.weights.download();
    std::vector<int32_t> ref_ids(64);
    std::vector<float> ref_w(64);
    md::reference::route(x.data(), 8, f.bias_host.data(), 1.0f, ref_ids.data(), ref_w.data());
    for (int t = 0; t < 8; ++t) {
      if (!well_separated(&x[t * 256], f.bias_host.data())) continue;
      for (int k = 0; k < 8; ++k) ASSERT_EQ(ids[t * 8 + k], ref_ids[t * 8 + k]);
    }
    std::vector<int32_t> ref(f.meta.size(), kPoison);
    md::reference::routing_metadata(ids.data(), 8, 96, 32, 16, ref.data());
    ASSERT_EQ(f.meta.download(), ref);
    // The same inputs again: the same bits.
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(f.ids.download(), ids);
    auto w2 = f.weights.download();
    for (int i = 0; i < 64; ++i) ASSERT_TRUE(same_bits(w2[i], w[i]));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(RouteGpu, BadInputLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const auto routing = f.routing();
  f.logits.upload(f.random_logits(8));
  f.ids.fill_bytes(0x5a);
  md::RoutingMetadata m{md::make_tensor(f.meta.get(), DType::kInt32, {(int64_t)f.meta.size()}), 0, 256, 12};
  EXPECT_THROW(routing(f.t_logits(8), f.t_ids(8), f.t_weights(8), m, nullptr), std::invalid_argument);
  EXPECT_THROW(routing(f.t_logits(8), f.t_ids(8), f.t_ids(8), std::nullopt, nullptr), std::invalid_argument);
  CUDA_OK(cudaDeviceSynchronize());
  for (int32_t v : f.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "a refused call wrote ids";
}

// route() with the bias as an argument and the unchecked launch of
// The unchecked launch of a checked call's params writes the bits the bound form writes.
TEST(RouteGpu, UnboundOpAndUncheckedLaunchMatchTheBoundForm) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const auto routing = f.routing();  // prepares the device
  f.logits.upload(f.random_logits(8));
  md::RoutingMetadata m{md::make_tensor(f.meta.get(), DType::kInt32, {(int64_t)f.meta.size()}), 32, 64, 32};
  const auto outputs = [&] { return std::make_tuple(f.ids.download(), f.weights.download(), f.meta.download()); };
  const auto poison = [&] {
    f.ids.fill_bytes(0xff);
    f.weights.fill_bytes(0xff);
    f.meta.upload(std::vector<int32_t>(f.meta.size(), kPoison));
  };
  poison();
  routing(f.t_logits(8), f.t_ids(8), f.t_weights(8), m, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto bound = outputs();

  md::RouteArgs a;
  a.logits = f.t_logits(8);
  a.expert_bias = routing.expert_bias();
  a.route_scale = routing.route_scale();
  a.ids = f.t_ids(8);
  a.weights = f.t_weights(8);
  a.metadata = m;
  poison();
  md::route(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(outputs() == bound) << "route() differs from the bound form";

  poison();
  CUDA_OK(static_cast<cudaError_t>(md::route_impl::launch(md::route_impl::params_of(a), nullptr)));
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(outputs() == bound) << "the unchecked launch differs from the bound form";
}

// The small calls compute-sanitizer runs (scripts/sanitize.sh): with metadata
// for one token (no cluster: shared atomics), two and eight (red.async into
// the first CTA, counted on its barrier), and eight without metadata. ids
// and weights are set before the calls: a call writes the rows of its b
// tokens only, and the download copies all 8 (initcheck).
TEST(RouteGpu, SanitizerShapes) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const auto routing = f.routing();
  f.ids.fill_bytes(0xff);
  f.weights.fill_bytes(0xff);
  for (int b : {1, 2, 8}) {
    SCOPED_TRACE(::testing::Message() << "b=" << b);
    const auto x = f.random_logits(b);
    f.logits.upload(x);
    f.meta.upload(std::vector<int32_t>(f.meta.size(), kPoison));
    md::RoutingMetadata m{md::make_tensor(f.meta.get(), DType::kInt32, {(int64_t)f.meta.size()}), 96, 32, 16};
    routing(f.t_logits(b), f.t_ids(b), f.t_weights(b), m, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto ids = f.ids.download();
    std::vector<int32_t> ref(f.meta.size(), kPoison);
    md::reference::routing_metadata(ids.data(), b, 96, 32, 16, ref.data());
    ASSERT_EQ(f.meta.download(), ref);
  }
  f.logits.upload(f.random_logits(8));
  routing(f.t_logits(8), f.t_ids(8), f.t_weights(8), std::nullopt, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
}
