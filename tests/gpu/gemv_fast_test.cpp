// The GEMV's launch shapes against the CPU reference: row splits across warps
// (few rows, long rows), grid-strided row groups (many rows), row ranges with
// strided and unaligned activations (scalar activation loads), token tiles of 8
// with a partial last tile, for a checkpoint format and ggml formats.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "random_weights.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

using dsv4::WeightFormat;
using quant::GgmlType;

constexpr double kNativeMaxRelRms = 1e-5;  // f32 math on exactly decoded weights
// ggml formats: the kernels quantise x to int8 per 32 (act_q8.cuh). Against a
// reference on the same quantised x only the f32 sums' rounding is left;
// against the exact x the quantisation's own error (~0.5% per dot, more for
// small dots) is checked where enough outputs make its RMS a stable number.
constexpr double kGgmlQuantisedMaxRelRms = 1e-4;
constexpr double kGgmlMaxRelRms = 2e-2;  // see gemv_ggml_test.cpp
constexpr size_t kGgmlMinOutputs = 64;

// x as the ggml kernels see it: per 32 elements scale = amax / 127 and codes
// rint(x * 127 / amax), in the kernel's f32 operations (act_q8_stage). Not the
// CPU lane's quantize_act: it multiplies by 1 / (amax / 127), which can round
// a code the other way.
std::vector<float> quantised_per32(const float* x, int64_t n) {
  std::vector<float> q(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; g += 32) {
    float amax = 0.0f;
    for (int64_t i = g; i < g + 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = g; i < g + 32; ++i) q[size_t(i)] = float(std::nearbyint(x[i] * inv)) * scale;
  }
  return q;
}

struct ShapeCase {
  std::string name;
  WeightFormat format;
  GgmlType ggml;
  int64_t out, in, row_begin, row_end, T;
  int64_t x_offset;  // floats: 1 makes the activations unaligned for float4 loads
};

class GemvShapeTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(GemvShapeTest, MatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  const ShapeCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  testing::Keep keep;
  const bool ggml = c.format == WeightFormat::kGgml;
  const dsv4::Linear w = ggml ? testing::random_ggml_linear(c.ggml, c.out, c.in, rng, keep)
                              : testing::random_native_linear(c.format, c.out, c.in, rng, keep);
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(linear_device_bytes(w), "test").is_ok());
  auto dw = upload_linear(w, arena);
  ASSERT_TRUE(dw.is_ok()) << dw.status().message();
  const int64_t ldx = c.in + c.x_offset, n_rows = c.row_end - c.row_begin, ldy = n_rows + 3;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(c.T * ldx + c.x_offset));
  for (float& v : x) v = nd(rng);
  const float* x0 = x.data() + c.x_offset;
  std::vector<float> xq;  // token t at xq + t * c.in
  for (int64_t t = 0; ggml && t < c.T; ++t) {
    const std::vector<float> q = quantised_per32(x0 + t * ldx, c.in);
    xq.insert(xq.end(), q.begin(), q.end());
  }
  std::vector<float> row(size_t(c.in)), want(size_t(c.T * ldy), std::nanf("")), want_q(want.size());
  for (int64_t r = c.row_begin; r < c.row_end; ++r) {
    ref::linear_dequant_row(w, r, row.data());
    for (int64_t t = 0; t < c.T; ++t) {
      double s = 0.0, sq = 0.0;
      for (int64_t i = 0; i < c.in; ++i) s += double(row[size_t(i)]) * double(x0[t * ldx + i]);
      for (int64_t i = 0; ggml && i < c.in; ++i) sq += double(row[size_t(i)]) * double(xq[size_t(t * c.in + i)]);
      want[size_t(t * ldy + r - c.row_begin)] = float(s);
      want_q[size_t(t * ldy + r - c.row_begin)] = float(sq);
    }
  }
  auto dx = upload_vector(x, "x");
  auto dy = upload_vector(std::vector<float>(want.size(), std::nanf("")), "y");
  ASSERT_TRUE(dx.is_ok() && dy.is_ok());
  ASSERT_TRUE(gemv_rows_f32(*dw, c.row_begin, c.row_end, dx->as<float>() + c.x_offset, ldx, c.T, dy->as<float>(), ldy,
                            nullptr)
                  .is_ok());
  auto got = download_vector(dy->as<float>(), want.size(), "y");
  ASSERT_TRUE(got.is_ok());
  std::vector<float> g, wv, wq;  // the written entries only; the row padding stays NaN
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = 0; r < n_rows; ++r) {
      g.push_back((*got)[size_t(t * ldy + r)]);
      wv.push_back(want[size_t(t * ldy + r)]);
      wq.push_back(want_q[size_t(t * ldy + r)]);
    }
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = n_rows; r < ldy; ++r) EXPECT_TRUE(std::isnan((*got)[size_t(t * ldy + r)])) << "wrote past the rows";
  if (!ggml) {
    EXPECT_LE(rel_rms(g.data(), wv.data(), g.size()), kNativeMaxRelRms);
    return;
  }
  EXPECT_LE(rel_rms(g.data(), wq.data(), g.size()), kGgmlQuantisedMaxRelRms) << "against the quantised x";
  if (g.size() >= kGgmlMinOutputs) {
    EXPECT_LE(rel_rms(g.data(), wv.data(), g.size()), kGgmlMaxRelRms) << "against x";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvShapeTest,
    ::testing::Values(
        ShapeCase{"fp8_split_rows_few", WeightFormat::kFP8Block, GgmlType::kF32, 3, 4096, 0, 3, 1, 0},
        ShapeCase{"fp8_split_rows_512", WeightFormat::kFP8Block, GgmlType::kF32, 512, 4096, 0, 512, 3, 0},
        ShapeCase{"fp8_many_rows_grid_stride", WeightFormat::kFP8Block, GgmlType::kF32, 40000, 256, 0, 40000, 1, 0},
        ShapeCase{"fp8_row_range_unaligned_x", WeightFormat::kFP8Block, GgmlType::kF32, 300, 1024, 37, 261, 2, 1},
        ShapeCase{"bf16_tiles_of_8_plus_1", WeightFormat::kBF16, GgmlType::kF32, 129, 2048, 0, 129, 9, 0},
        ShapeCase{"mxfp4_split_t8", WeightFormat::kMXFP4, GgmlType::kF32, 64, 8192, 0, 64, 8, 0},
        ShapeCase{"q2k_split_rows_few", WeightFormat::kGgml, GgmlType::kQ2_K, 5, 8192, 0, 5, 1, 0},
        ShapeCase{"iq2xxs_many_rows", WeightFormat::kGgml, GgmlType::kIQ2_XXS, 9000, 512, 0, 9000, 2, 0},
        ShapeCase{"q3k_row_range_t8", WeightFormat::kGgml, GgmlType::kQ3_K, 200, 1024, 13, 190, 8, 0},
        ShapeCase{"iq4xs_tiles_17", WeightFormat::kGgml, GgmlType::kIQ4_XS, 33, 512, 0, 33, 17, 0}),
    [](const ::testing::TestParamInfo<ShapeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace aff::cuda
