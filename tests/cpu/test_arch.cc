#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "check_util.h"
#include "common/no_device.h"
#include "muse_decode/arch.h"
#include "muse_decode/attn2.h"
#include "muse_decode/qkv_front.h"
#include "muse_decode/route.h"
#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace md = muse_decode;
using muse_decode::testing::error_of;

TEST(Arch, UnavailableNamesTheKernel) {
  EXPECT_EQ(md::unavailable("attn2"),
            "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (attn2)");
  EXPECT_EQ(md::unavailable("route"), "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (route)");
  EXPECT_EQ(md::unavailable("qkv_front"),
            "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (qkv_front)");
  EXPECT_EQ(md::unavailable("o_proj"), "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (o_proj)");
  EXPECT_EQ(md::unavailable("attention_block"),
            "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (attention_block)");
}

TEST(Arch, UnavailableRefusesAnUnknownKernel) {
  EXPECT_EQ(error_of([] { md::unavailable("bogus"); }),
            "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got 'bogus'");
  EXPECT_EQ(error_of([] { md::unavailable(""); }), "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got ''");
  EXPECT_EQ(error_of([] { md::unavailable("attn2 "); }),
            "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got 'attn2 '");
}

TEST(Arch, DeviceQueriesRefuseANegativeOrdinal) {
  const std::string refusal = "device must be -1 (the current device) or an ordinal >= 0, got -2";
  EXPECT_EQ(error_of([] { md::gpu_family(-2); }), refusal);
  EXPECT_EQ(error_of([] { md::describe_device(-2); }), refusal);
  EXPECT_EQ(error_of([] { md::sm_count(-2); }), refusal);
  EXPECT_EQ(error_of([] { md::gpu_family(INT_MIN); }),
            "device must be -1 (the current device) or an ordinal >= 0, got -2147483648");
  // -1 is the current device, whatever the machine has.
  EXPECT_NO_THROW(md::gpu_family(-1));
  EXPECT_NO_THROW(md::describe_device(-1));
  EXPECT_NO_THROW(md::sm_count(-1));
}

// No driver at all, a driver older than the runtime and a machine without a
// GPU each get their own words; the runtime gives the same error for the
// first two.
TEST(Arch, NoDeviceReasonsPointAtTheFix) {
  const std::string insufficient = "CUDA driver version is insufficient for CUDA runtime version";
  const std::string none = md::detail::no_device_reason(0, 13000, true, insufficient);
  const std::string old = md::detail::no_device_reason(12040, 13000, true, insufficient);
  EXPECT_EQ(none, "no CUDA device (no NVIDIA driver found: the CUDA runtime could not load libcuda.so.1)");
  EXPECT_EQ(old,
            "no CUDA device (the NVIDIA driver supports CUDA 12.4, older than the CUDA 13.0 runtime this library is "
            "built with: update the driver)");
  EXPECT_EQ(none.find("insufficient"), std::string::npos) << none;
  EXPECT_EQ(old.find("no NVIDIA driver"), std::string::npos) << old;
  EXPECT_NE(md::detail::no_device_reason(12080, 13010, true, insufficient).find("CUDA 12.8, older than the CUDA 13.1 "),
            std::string::npos);
  // A driver without a GPU, and errors the reason has no words of its own for.
  EXPECT_EQ(md::detail::no_device_reason(13000, 13000, false, "no CUDA-capable device is detected"),
            "no CUDA device (no CUDA-capable device is detected)");
  EXPECT_EQ(md::detail::no_device_reason(13000, 13000, false, ""), "no CUDA device");
  EXPECT_EQ(md::detail::no_device_reason(-1, 13000, true, insufficient), "no CUDA device (" + insufficient + ")");
}

TEST(Arch, Families) {
  EXPECT_TRUE(md::supported_family(md::GpuFamily::kSm90));
  EXPECT_TRUE(md::supported_family(md::GpuFamily::kSm100));
  EXPECT_FALSE(md::supported_family(md::GpuFamily::kOther));
  EXPECT_FALSE(md::supported_family(md::GpuFamily::kNone));
  EXPECT_STREQ(md::gpu_family_name(md::GpuFamily::kSm90), "sm90");
  // Never throws, whatever the machine has.
  EXPECT_NO_THROW(md::gpu_family());
  EXPECT_FALSE(md::describe_device().empty());
}

// Every prepare_<op> refuses alike: the op named once, the GPUs it runs on,
// what the device is; and a negative ordinal other than -1 as an argument.
TEST(Arch, PrepareRefusalsAreAlike) {
  using muse_decode::testing::kUnpreparedDevice;
  const std::pair<const char*, void (*)(int)> ops[] = {
      {"route", md::prepare_route}, {"attn2", md::prepare_attn2}, {"qkv_front", md::prepare_qkv_front}};
  for (const auto& [op, prepare] : ops) {
    const std::string why = error_of([&] { prepare(kUnpreparedDevice); });
    EXPECT_EQ(why, std::string(op) + " runs only on SM90 (H100/H200) or the SM100 family (B200/B300); found: " +
                       md::describe_device(kUnpreparedDevice));
    EXPECT_EQ(why.find(op), why.rfind(op)) << why;
    EXPECT_EQ(error_of([&] { prepare(-2); }), "device must be -1 (the current device) or an ordinal >= 0, got -2");
  }
  EXPECT_EQ(error_of([] { md::attn2_residency(-3); }),
            "device must be -1 (the current device) or an ordinal >= 0, got -3");
}

TEST(Constants, ModelFacts) {
  EXPECT_EQ(md::kNumHeads, md::kHeadsPerKvHead * md::kNumKvHeads);
  EXPECT_EQ(md::qkv_width(2), 2304);
  EXPECT_EQ(md::qkv_width(16), 18432);
  // softmax scale = 64^-0.5 * qk_scale_factor, to float precision.
  EXPECT_EQ(md::kSoftmaxScale, static_cast<float>(0.125 * md::kQkScaleFactor));
}

TEST(Tensor, Views) {
  auto t = md::make_tensor(nullptr, md::DType::kBFloat16, {8, 2304});
  EXPECT_EQ(t.numel(), 8 * 2304);
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.span_bytes(), 8 * 2304 * 2);
  EXPECT_EQ(t.shape_str(), "[8, 2304]");
  t.shape[1] = 1024;  // a column view: rows keep their stride
  EXPECT_FALSE(t.contiguous());
  EXPECT_EQ(t.span_bytes(), (7 * 2304 + 1024) * 2);
  EXPECT_FALSE(md::TensorRef{}.present());
}
