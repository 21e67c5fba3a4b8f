// The GEMV on every ggml block format the GPU reads, against the CPU reference
// (row dequantised by src/quant, then an f64 dot): odd row counts, several
// super-blocks per row, T in {1, 2, 3, 8}; and the uploader's refusal of a
// type the GPU does not decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "host_product.h"
#include "random_weights.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

using quant::GgmlType;

// The kernels quantise activations to int8 per 32 (allowed by issue 5): about
// 0.5% error per dot relative to the dot's natural size sqrt(sum (w_i x_i)^2).
// Errors are measured against that size, not against the result: a single
// output row whose terms happen to cancel would otherwise make the ratio
// arbitrarily large (a one-row case failed that way now and then). 2e-2 still
// catches any decode error (a wrong element order or scale gives errors near 1).
constexpr double kGgmlMaxRelRms = 2e-2;

struct GgmlCase {
  GgmlType type;
  int64_t out, in;
};

std::string case_name(const ::testing::TestParamInfo<GgmlCase>& i) {
  return std::string(quant::ggml_type_name(i.param.type)) + "_" + std::to_string(i.param.out) + "x" +
         std::to_string(i.param.in);
}

using testing::host_product;
using testing::rel_to_size;

class GgmlGemvTest : public ::testing::TestWithParam<GgmlCase> {};

TEST_P(GgmlGemvTest, MatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  const GgmlCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  testing::Keep keep;
  const dsv4::Linear w = testing::random_ggml_linear(c.type, c.out, c.in, rng, keep);
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(linear_device_bytes(w), "test").is_ok());
  auto dw = upload_linear(w, arena);
  ASSERT_TRUE(dw.is_ok()) << dw.status().message();
  EXPECT_EQ(dw->format, DevFormat::kGgml);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t T : {1, 2, 3, 8}) {
    std::vector<float> x(size_t(T * c.in));
    for (float& v : x) v = nd(rng);
    std::vector<double> size;
    const std::vector<float> want = host_product(w, x, T, size);
    auto dx = upload_vector(x, "x");
    auto dy = upload_vector(std::vector<float>(want.size(), std::nanf("")), "y");
    ASSERT_TRUE(dx.is_ok() && dy.is_ok());
    ASSERT_TRUE(gemv_f32(*dw, dx->as<float>(), T, dy->as<float>(), nullptr).is_ok());
    auto got = download_vector(dy->as<float>(), want.size(), "y");
    ASSERT_TRUE(got.is_ok());
    for (float v : *got) ASSERT_TRUE(std::isfinite(v)) << "T=" << T;
    EXPECT_LE(rel_to_size(got->data(), want.data(), size), kGgmlMaxRelRms) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgmlGemvTest,
    ::testing::Values(GgmlCase{GgmlType::kQ8_0, 37, 96}, GgmlCase{GgmlType::kQ8_0, 129, 4096},
                      GgmlCase{GgmlType::kMXFP4, 33, 160}, GgmlCase{GgmlType::kMXFP4, 65, 2048},
                      GgmlCase{GgmlType::kIQ4_NL, 17, 224}, GgmlCase{GgmlType::kQ2_K, 97, 768},
                      GgmlCase{GgmlType::kQ2_K, 1, 4096}, GgmlCase{GgmlType::kQ3_K, 45, 1280},
                      GgmlCase{GgmlType::kQ4_K, 57, 512}, GgmlCase{GgmlType::kQ5_K, 31, 768},
                      GgmlCase{GgmlType::kQ6_K, 23, 1024}, GgmlCase{GgmlType::kIQ4_XS, 41, 2304},
                      GgmlCase{GgmlType::kIQ2_XXS, 97, 2048}, GgmlCase{GgmlType::kIQ2_XXS, 3, 256},
                      GgmlCase{GgmlType::kIQ2_XS, 19, 512}, GgmlCase{GgmlType::kIQ3_XXS, 29, 768},
                      GgmlCase{GgmlType::kIQ1_S, 13, 1024}, GgmlCase{GgmlType::kIQ1_M, 27, 512}),
    case_name);

TEST(GgmlUpload, RefusesTypesTheGpuDoesNotDecodeNamingTheTensor) {
  AFF_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> bytes(110 * 2);
  dsv4::Linear w;
  w.format = dsv4::WeightFormat::kGgml;
  w.ggml_type = int(GgmlType::kIQ3_S);
  w.out = 2, w.in = 256;
  w.weight.name = "blk.3.ffn_down_exps.weight", w.weight.file = "model.gguf";
  w.weight.dtype = DType::kU8, w.weight.shape = {2, 110}, w.weight.data = bytes.data();
  w.weight.nbytes = int64_t(bytes.size());
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(linear_device_bytes(w), "test").is_ok());
  auto dw = upload_linear(w, arena);
  ASSERT_FALSE(dw.is_ok());
  EXPECT_NE(dw.status().message().find("blk.3.ffn_down_exps.weight"), std::string::npos) << dw.status().message();
  EXPECT_NE(dw.status().message().find("IQ3_S"), std::string::npos) << dw.status().message();
}

}  // namespace
}  // namespace aff::cuda
