// GGUF write -> read round trip: every metadata value type (nested arrays included),
// tensors of several ggml types and odd shapes with fresh random data written in chunks,
// alignment padding, and the writer's temp-file/rename discipline.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <vector>

#include "format/gguf_reader.h"
#include "format/gguf_writer.h"

namespace aff::format {
namespace {

using quant::GgmlType;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("aff_gguf_" + std::to_string(::getpid()) + "_" + name)).string();
}

struct Planned {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;
};

std::vector<std::pair<std::string, GgufValue>> all_value_types(std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"general.architecture", GgufValue::string("deepseek4")},
      {"t.u8", GgufValue::u8(uint8_t(byte(rng)))},
      {"t.i8", GgufValue::i8(-int8_t(byte(rng) % 100) - 1)},
      {"t.u16", GgufValue::u16(uint16_t(byte(rng) * 251))},
      {"t.i16", GgufValue::i16(int16_t(-byte(rng) * 97))},
      {"t.u32", GgufValue::u32(uint32_t(rng()))},
      {"t.i32", GgufValue::i32(-int32_t(rng() % 1000000))},
      {"t.u64", GgufValue::u64((uint64_t(rng()) << 32) | rng())},
      {"t.i64", GgufValue::i64(-int64_t((uint64_t(rng()) << 20) | rng()))},
      {"t.f32", GgufValue::f32(std::uniform_real_distribution<float>(-5, 5)(rng))},
      {"t.f64", GgufValue::f64(std::uniform_real_distribution<double>(-5, 5)(rng))},
      {"t.bool", GgufValue::boolean(rng() & 1)},
      {"t.string", GgufValue::string("héllo ｜DSML｜ \n\t")},
      {"t.empty_string", GgufValue::string("")},
      {"t.arr_i32", GgufValue::array(GgufType::kI32, std::vector<int32_t>{0, 4, 128, -3, 7})},
      {"t.arr_f32", GgufValue::array(GgufType::kF32, std::vector<float>{10.0f, 1.5f, -0.25f})},
      {"t.arr_u8", GgufValue::array(GgufType::kU8, std::vector<int>{1, 2, 255})},
      {"t.arr_bool", GgufValue::array(GgufType::kBool, std::vector<int>{1, 0, 1})},
      {"t.arr_f64", GgufValue::array(GgufType::kF64, std::vector<double>{1e300, -2.0})},
      {"t.arr_u64", GgufValue::array(GgufType::kU64, std::vector<uint64_t>{uint64_t(1) << 63})},
      {"t.arr_empty", GgufValue::array(GgufType::kU32, std::vector<uint32_t>{})},
      {"t.arr_str", GgufValue::array_strings({"a", "", "Ġthe", "<｜end▁of▁sentence｜>"})},
      {"t.arr_nested",
       GgufValue::array_arrays({GgufValue::array(GgufType::kI16, std::vector<int>{-1, 2}),
                                GgufValue::array_strings({"x", "yz"}),
                                GgufValue::array_arrays({GgufValue::array(GgufType::kU8, std::vector<int>{9})})})},
  };
  return kv;
}

std::vector<Planned> random_tensors(std::mt19937& rng) {
  std::vector<Planned> t = {
      {"output_norm.weight", GgmlType::kF32, {17}, {}},
      {"token_embd.weight", GgmlType::kF16, {97, 3}, {}},
      {"blk.0.attn_q_a.weight", GgmlType::kQ8_0, {96, 5}, {}},
      {"blk.0.ffn_gate_exps.weight", GgmlType::kIQ2_XXS, {512, 3, 5}, {}},
      {"blk.0.ffn_down_exps.weight", GgmlType::kQ2_K, {256, 7, 5}, {}},
      {"blk.0.empty", GgmlType::kF32, {0}, {}},
      {"blk.0.ffn_up_exps.weight", GgmlType::kMXFP4, {64, 1, 1, 3}, {}},
      {"blk.0.ffn_gate_tid2eid.weight", GgmlType::kI32, {6, 11}, {}},
  };
  for (auto& p : t) {
    int64_t rows = 1;
    for (size_t i = 1; i < p.ne.size(); ++i) rows *= p.ne[i];
    p.data.resize(size_t(*quant::ggml_row_bytes(p.type, p.ne[0]) * rows));
    for (auto& b : p.data) b = uint8_t(rng());
  }
  return t;
}

class GgufRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufRoundTrip, WriteThenRead) {
  const uint32_t alignment = GetParam();
  std::mt19937 rng(std::random_device{}());
  const auto kv = all_value_types(rng);
  const auto tensors = random_tensors(rng);
  const std::string path = temp_path("rt_" + std::to_string(alignment) + ".gguf");
  {
    GgufWriter w(path, alignment);
    for (const auto& [k, v] : kv) ASSERT_TRUE(w.set(k, v).is_ok()) << k;
    for (const auto& t : tensors) ASSERT_TRUE(w.add_tensor(t.name, t.type, t.ne).is_ok()) << t.name;
    ASSERT_TRUE(w.write_header().is_ok());
    // Stream all data in odd-sized chunks that straddle tensor boundaries.
    std::vector<uint8_t> all;
    for (const auto& t : tensors) all.insert(all.end(), t.data.begin(), t.data.end());
    size_t pos = 0;
    while (pos < all.size()) {
      const size_t n = std::min<size_t>(all.size() - pos, 1 + rng() % 61);
      ASSERT_TRUE(w.append(std::span<const uint8_t>(all).subspan(pos, n)).is_ok());
      pos += n;
    }
    EXPECT_FALSE(fs::exists(path));  // only the temp file exists until finish
    ASSERT_TRUE(w.finish().is_ok());
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const GgufFile& f = r.value();
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  ASSERT_EQ(f.metadata().size(), kv.size() + 1);  // + general.alignment
  for (const auto& [k, v] : kv) {
    const GgufValue* got = f.find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_TRUE(*got == v) << k;
  }
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& want = tensors[i];
    const auto& got = f.tensors()[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.type, want.type);
    EXPECT_EQ(got.ne, want.ne);
    EXPECT_EQ(got.offset % alignment, 0u);
    const auto bytes = f.tensor_data(got);
    ASSERT_EQ(bytes.size(), want.data.size()) << want.name;
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), want.data.begin())) << want.name;
  }
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufRoundTrip, ::testing::Values(32u, 8u, 64u, 4096u));

TEST(GgufWriter, RejectsMisuseAndCleansUp) {
  const std::string path = temp_path("misuse.gguf");
  {
    GgufWriter w(path);
    EXPECT_FALSE(w.set("general.alignment", GgufValue::u32(64)).is_ok());
    EXPECT_TRUE(w.set("a.key", GgufValue::u32(1)).is_ok());
    EXPECT_FALSE(w.set("a.key", GgufValue::u32(2)).is_ok());  // duplicate
    EXPECT_FALSE(w.add_tensor("q", GgmlType::kQ4_K, {100, 2}).is_ok());  // not a block multiple
    EXPECT_FALSE(w.add_tensor("five", GgmlType::kF32, {1, 1, 1, 1, 1}).is_ok());
    EXPECT_FALSE(w.add_tensor(std::string(64, 'n'), GgmlType::kF32, {4}).is_ok());  // name too long
    ASSERT_TRUE(w.add_tensor("a", GgmlType::kF32, {4}).is_ok());
    ASSERT_TRUE(w.add_tensor("b", GgmlType::kF32, {2}).is_ok());
    EXPECT_FALSE(w.add_tensor("a", GgmlType::kF32, {4}).is_ok());  // duplicate
    ASSERT_TRUE(w.write_header().is_ok());
    const std::vector<uint8_t> four(16, 1);
    EXPECT_FALSE(w.write_tensor("b", std::span<const uint8_t>(four).first(8)).is_ok());  // out of order
    EXPECT_TRUE(w.write_tensor("a", four).is_ok());
    EXPECT_FALSE(w.finish().is_ok());  // b not written
    const std::vector<uint8_t> too_many(12, 2);
    EXPECT_FALSE(w.append(too_many).is_ok());  // 4 bytes past the last tensor
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }
  // Destroyed without a successful finish: no output, no temp file.
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace aff::format
