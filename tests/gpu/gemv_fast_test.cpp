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
constexpr double kGgmlMaxRelRms = 2e-2;    // int8 activations per 32 (see gemv_ggml_test.cpp)

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
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
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
  std::vector<float> row(size_t(c.in)), want(size_t(c.T * ldy), std::nanf(""));
  for (int64_t r = c.row_begin; r < c.row_end; ++r) {
    ref::linear_dequant_row(w, r, row.data());
    for (int64_t t = 0; t < c.T; ++t) {
      double s = 0.0;
      for (int64_t i = 0; i < c.in; ++i) s += double(row[size_t(i)]) * double(x0[t * ldx + i]);
      want[size_t(t * ldy + r - c.row_begin)] = float(s);
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
  std::vector<float> g, wv;  // the written entries only; the row padding stays NaN
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = 0; r < n_rows; ++r) {
      g.push_back((*got)[size_t(t * ldy + r)]);
      wv.push_back(want[size_t(t * ldy + r)]);
    }
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = n_rows; r < ldy; ++r) EXPECT_TRUE(std::isnan((*got)[size_t(t * ldy + r)])) << "wrote past the rows";
  EXPECT_LE(rel_rms(g.data(), wv.data(), g.size()), ggml ? kGgmlMaxRelRms : kNativeMaxRelRms);
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
