// Dequantisation must be bit-identical to the independent gguf Python package
// (gguf.quants.dequantize) for every listed type. Fixtures come from
// tools/quant/gen_quant_fixtures.py: random blocks with finite scales.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/codec.h"

namespace aff::quant {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct Fixture {
  GgmlType type;
  std::vector<uint8_t> row;
  std::vector<float> values;  // inputs (quant fixtures) or expected outputs (dequant)
};

// "AFQD": header, row bytes, n f32. "AFQQ": header, n f32, row bytes.
Fixture load(const std::string& name, const char* magic) {
  const auto bytes = read_file(std::string(AFFINITY_TEST_DATA) + "/quant/" + name);
  EXPECT_GE(bytes.size(), 12u) << name;
  if (bytes.size() < 12) return {};
  EXPECT_EQ(std::memcmp(bytes.data(), magic, 4), 0) << name;
  uint32_t type_id, n;
  std::memcpy(&type_id, bytes.data() + 4, 4);
  std::memcpy(&n, bytes.data() + 8, 4);
  Fixture fx;
  fx.type = GgmlType(type_id);
  const size_t row_bytes = size_t(*ggml_row_bytes(fx.type, n));
  EXPECT_EQ(bytes.size(), 12 + row_bytes + 4 * size_t(n)) << name;
  fx.row.resize(row_bytes);
  fx.values.resize(n);
  const bool dequant = magic[3] == 'D';
  const uint8_t* p = bytes.data() + 12;
  if (dequant) {
    std::memcpy(fx.row.data(), p, row_bytes);
    std::memcpy(fx.values.data(), p + row_bytes, 4 * size_t(n));
  } else {
    std::memcpy(fx.values.data(), p, 4 * size_t(n));
    std::memcpy(fx.row.data(), p + 4 * size_t(n), row_bytes);
  }
  return fx;
}

class DequantVsGgufPy : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantVsGgufPy, BitIdentical) {
  const std::string type_name = GetParam();
  const Fixture fx = load("dequant_" + type_name + ".bin", "AFQD");
  ASSERT_EQ(ggml_type_name(fx.type), type_name);
  std::vector<float> got(fx.values.size(), std::nanf(""));  // poisoned
  ASSERT_TRUE(dequantize_row(fx.type, fx.row, got).is_ok());
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_from_f32(got[i]) != bits_from_f32(fx.values[i]) && ++mismatches <= 5) {
      ADD_FAILURE() << type_name << " element " << i << ": got " << got[i] << " expected "
                    << fx.values[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantVsGgufPy,
                         ::testing::Values("F32", "F16", "BF16", "Q8_0", "MXFP4", "Q2_K", "Q3_K",
                                           "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
                                           "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS"),
                         [](const auto& info) { return std::string(info.param); });

// Q8_0 and MXFP4 have a single natural quantiser, which the gguf package reproduces
// bit-exactly from ggml; ours must give the same bytes so that our files match theirs.
class QuantVsGgufPy : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantVsGgufPy, ByteIdentical) {
  const std::string type_name = GetParam();
  const Fixture fx = load("quant_" + type_name + ".bin", "AFQQ");
  std::vector<uint8_t> got(fx.row.size(), 0xA5);
  ASSERT_TRUE(quantize_row(fx.type, fx.values, got).is_ok());
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != fx.row[i] && ++mismatches <= 5) {
      ADD_FAILURE() << type_name << " byte " << i << ": got " << int(got[i]) << " expected "
                    << int(fx.row[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(ExactQuantisers, QuantVsGgufPy, ::testing::Values("Q8_0", "MXFP4"),
                         [](const auto& info) { return std::string(info.param); });

TEST(DequantizeRow, RejectsWrongSizes) {
  std::vector<uint8_t> row(144);
  std::vector<float> out(255);
  EXPECT_FALSE(dequantize_row(GgmlType::kQ4_K, row, out).is_ok());  // not a block multiple
  out.resize(512);
  EXPECT_FALSE(dequantize_row(GgmlType::kQ4_K, row, out).is_ok());  // bytes for 256 only
  out.resize(256);
  EXPECT_TRUE(dequantize_row(GgmlType::kQ4_K, row, out).is_ok());
  std::vector<uint8_t> q40(18);
  std::vector<float> out32(32);
  const Status s = dequantize_row(GgmlType::kQ4_0, q40, out32);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("Q4_0"), std::string::npos);
}

}  // namespace
}  // namespace aff::quant
