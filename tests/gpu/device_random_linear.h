// Random device weights in the checkpoint formats (FP8 block, MXFP4, BF16,
// F16, F32) uploaded straight to a DeviceLinear, for GPU kernel tests that
// compare two device paths.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_weights.h"
#include "core/dtype.h"

namespace aff::cuda::testing {

struct RandomWeight {
  std::vector<DeviceBuffer> keep;
  DeviceLinear w;
};

inline RandomWeight make_weight(DevFormat f, int64_t out, int64_t in, std::mt19937_64& rng) {
  RandomWeight r;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), e8(122, 130);
  auto up = [&](const auto& v) {
    auto b = upload_vector(v, "weight");
    EXPECT_TRUE(b.is_ok());
    r.keep.push_back(std::move(*b));
    return r.keep.back().template as<uint8_t>();
  };
  r.w.format = f, r.w.out = out, r.w.in = in;
  switch (f) {
    case DevFormat::kF32: {
      std::vector<float> v(size_t(out * in));
      for (float& x : v) x = nd(rng);
      r.w.weight = up(v);
      break;
    }
    case DevFormat::kBF16:
    case DevFormat::kF16: {
      std::vector<uint16_t> v(size_t(out * in));
      for (uint16_t& x : v) x = f == DevFormat::kBF16 ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng));
      r.w.weight = up(v);
      break;
    }
    case DevFormat::kFP8Block: {
      std::vector<uint8_t> v(size_t(out * in));
      for (uint8_t& x : v) x = f32_to_e4m3(nd(rng) * 50.0f);
      r.w.block = 128;
      r.w.scale_cols = (in + 127) / 128;
      std::vector<uint8_t> s(size_t((out + 127) / 128 * r.w.scale_cols));
      for (uint8_t& x : s) x = uint8_t(e8(rng));
      r.w.weight = up(v), r.w.scale = up(s), r.w.scale_type = DevScale::kE8M0;
      break;
    }
    case DevFormat::kMXFP4: {
      std::vector<uint8_t> v(size_t(out * in / 2));
      for (uint8_t& x : v) x = uint8_t(byte(rng));
      r.w.scale_cols = in / 32;
      std::vector<uint8_t> s(size_t(out * in / 32));
      for (uint8_t& x : s) x = uint8_t(e8(rng));
      r.w.weight = up(v), r.w.scale = up(s), r.w.scale_type = DevScale::kE8M0;
      break;
    }
    default: break;
  }
  return r;
}

inline const char* name_of(DevFormat f) {
  switch (f) {
    case DevFormat::kF32: return "f32";
    case DevFormat::kBF16: return "bf16";
    case DevFormat::kF16: return "f16";
    case DevFormat::kFP8Block: return "fp8";
    case DevFormat::kMXFP4: return "mxfp4";
    default: return "?";
  }
}

}  // namespace aff::cuda::testing
