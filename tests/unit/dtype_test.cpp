#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"

namespace aff {
namespace {

TEST(DType, Bf16RoundTripIsRne) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): up.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, E4M3DecodeKnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
}

TEST(DType, E4M3EncodeRoundTripsEveryFiniteCode) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(uint8_t(b));
    const uint8_t back = f32_to_e4m3(v);
    EXPECT_EQ(e4m3_to_f32(back), v) << "code " << b;
  }
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);  // saturates
}

TEST(DType, E4M3EncodeIsNearestOnRandomValues) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-460.0f, 460.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng);
    const float q = e4m3_to_f32(f32_to_e4m3(x));
    const float cx = std::fmax(-448.0f, std::fmin(448.0f, x));
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      ASSERT_LE(std::fabs(q - cx), std::fabs(e4m3_to_f32(uint8_t(b)) - cx)) << x;
    }
  }
}

TEST(DType, E2M1RoundsToNearestEven) {
  EXPECT_EQ(kE2M1ToF32[f32_to_e2m1(1.75f)], 2.0f);   // tie between 1.5 and 2: even code
  EXPECT_EQ(kE2M1ToF32[f32_to_e2m1(-1.75f)], -2.0f);
  EXPECT_EQ(kE2M1ToF32[f32_to_e2m1(0.25f)], 0.0f);   // tie between 0 and 0.5
  EXPECT_EQ(kE2M1ToF32[f32_to_e2m1(5.0f)], 4.0f);    // tie between 4 and 6 -> 4 (even)
  EXPECT_EQ(kE2M1ToF32[f32_to_e2m1(9.0f)], 6.0f);
}

TEST(DType, E8M0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, F16RoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 31) continue;  // inf/nan
    const float v = f16_to_f32(uint16_t(h));
    EXPECT_EQ(f32_to_f16(v), uint16_t(h)) << h;
  }
}

}  // namespace
}  // namespace aff
