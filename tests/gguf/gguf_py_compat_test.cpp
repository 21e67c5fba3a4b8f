// A GGUF written by the independent gguf Python package (GGUFWriter, deepseek4 names;
// tools/quant/gen_gguf_fixture.py) must read correctly with our reader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "format/gguf_dsv4_names.h"
#include "format/gguf_reader.h"
#include "quant/codec.h"

namespace aff::format {
namespace {

using quant::GgmlType;

float formula(int64_t i, float scale = 0.25f, float offset = -3.0f) {
  return float(i % 29) * scale + offset;
}

class GgufPyCompat : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = GgufFile::open(std::string(AFFINITY_TEST_DATA) + "/quant/gguf_py_deepseek4.gguf");
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    file_ = std::make_unique<GgufFile>(std::move(r).value());
  }
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufPyCompat, Metadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.architecture().value(), "deepseek4");
  EXPECT_EQ(f.get_uint(dsv4_key::kBlockCount).value(), 2u);
  EXPECT_EQ(f.get_uint(dsv4_key::kEmbeddingLength).value(), 64u);
  EXPECT_EQ(f.get_uint(dsv4_key::kExpertCount).value(), 4u);
  EXPECT_EQ(f.get_float(dsv4_key::kExpertWeightsScale).value(), 1.5);
  EXPECT_TRUE(f.get_bool(dsv4_key::kExpertWeightsNorm).value());
  EXPECT_EQ(f.get_float("deepseek4.test.f64").value(), -2.5);
  EXPECT_EQ(f.get_int("deepseek4.test.i64").value(), -1234567890123);
  EXPECT_EQ(f.get_uint("deepseek4.test.u64").value(), uint64_t(1) << 40);
  EXPECT_EQ(f.get_int("deepseek4.test.i8").value(), -7);
  EXPECT_EQ(f.get_uint("deepseek4.test.u16").value(), 65000u);
  EXPECT_FALSE(f.get_uint("deepseek4.test.i64").is_ok());  // negative: not representable
  EXPECT_EQ(f.get_string(dsv4_key::kTokenizerModel).value(), "gpt2");

  const GgufValue* ratios = f.find(dsv4_key::kCompressRatios);
  ASSERT_NE(ratios, nullptr);
  ASSERT_EQ(ratios->array_size(), 3u);
  EXPECT_EQ(ratios->array_int(0).value(), 0);
  EXPECT_EQ(ratios->array_int(1).value(), 4);
  EXPECT_EQ(ratios->array_int(2).value(), 128);
  const GgufValue* clamp = f.find(dsv4_key::kSwigluClampExp);
  ASSERT_NE(clamp, nullptr);
  EXPECT_EQ(clamp->array_type(), GgufType::kF32);
  EXPECT_EQ(clamp->array_float(1).value(), 10.0);
  const GgufValue* tokens = f.find(dsv4_key::kTokenizerTokens);
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->array_strings().size(), 4u);
  EXPECT_EQ(tokens->array_strings()[0], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tokens->array_strings()[3], "ab");
  const Status missing = f.get_uint("deepseek4.nope").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("deepseek4.nope"), std::string::npos);
}

TEST_F(GgufPyCompat, Tensors) {
  const GgufFile& f = *file_;
  ASSERT_EQ(f.tensors().size(), 5u);

  const auto* norm = f.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::kF32);
  EXPECT_EQ(norm->ne, (std::vector<int64_t>{64}));
  std::vector<float> v(64);
  ASSERT_TRUE(quant::dequantize_row(norm->type, f.tensor_data(*norm), v).is_ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(v[size_t(i)], formula(i)) << i;

  const auto* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kF16);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{64, 4}));
  std::vector<float> e(256);
  ASSERT_TRUE(quant::dequantize_row(embd->type, f.tensor_data(*embd), e).is_ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(e[size_t(i)], formula(i)) << i;

  // Q8_0 written by gguf-py's quantiser: our quantiser must give the same bytes, and the
  // decoded values must be close to the source.
  const auto* q8 = f.find_tensor("blk.0.attn_q_a.weight");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->type, GgmlType::kQ8_0);
  EXPECT_EQ(q8->ne, (std::vector<int64_t>{64, 3}));
  std::vector<float> src(192), deq(192);
  for (int i = 0; i < 192; ++i) src[size_t(i)] = formula(i, 0.125f, -1.5f);
  std::vector<uint8_t> ours(q8->nbytes);
  ASSERT_TRUE(quant::quantize_row(GgmlType::kQ8_0, src, ours).is_ok());
  const auto theirs = f.tensor_data(*q8);
  EXPECT_TRUE(std::equal(ours.begin(), ours.end(), theirs.begin(), theirs.end()));
  ASSERT_TRUE(quant::dequantize_row(GgmlType::kQ8_0, theirs, deq).is_ok());
  for (int i = 0; i < 192; ++i) EXPECT_NEAR(deq[size_t(i)], src[size_t(i)], 0.02f) << i;

  const auto* hash = f.find_tensor("blk.0.ffn_gate_tid2eid.weight");
  ASSERT_NE(hash, nullptr);
  EXPECT_EQ(hash->type, GgmlType::kI32);
  EXPECT_EQ(hash->ne, (std::vector<int64_t>{2, 4}));
  const auto hb = f.tensor_data(*hash);
  ASSERT_EQ(hb.size(), 32u);
  for (int i = 0; i < 8; ++i) {
    int32_t x;
    std::memcpy(&x, hb.data() + 4 * i, 4);
    EXPECT_EQ(x, i * 3 - 5);
  }

  // Stacked experts: ne = [in, out, n_expert], raw MXFP4 bytes as written.
  const auto* exps = f.find_tensor("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(exps, nullptr);
  EXPECT_EQ(exps->type, GgmlType::kMXFP4);
  EXPECT_EQ(exps->ne, (std::vector<int64_t>{64, 2, 4}));
  EXPECT_EQ(exps->nbytes, 4u * 2u * 34u);
  const auto eb = f.tensor_data(*exps);
  for (size_t i = 0; i < eb.size(); ++i) EXPECT_EQ(eb[i], uint8_t(i * 7 % 251)) << i;
  EXPECT_EQ(dsv4_hf_name(exps->name, 3).value(), "layers.1.ffn.experts.3.w1.weight");
}

}  // namespace
}  // namespace aff::format
