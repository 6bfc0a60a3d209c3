#include <gtest/gtest.h>

#include "muse_decode/arch.h"
#include "muse_decode/constants.h"
#include "muse_decode/tensor.h"

namespace md = muse_decode;

TEST(Arch, UnavailableNamesTheKernel) {
  EXPECT_EQ(md::unavailable("attn2"),
            "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (attn2)");
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
