// Both imatrix formats, written here byte by byte (legacy) or with our GGUF writer
// (GGUF imatrix, as llama-imatrix lays it out), then parsed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "format/gguf_writer.h"
#include "quant/imatrix.h"
#include "quantize_test_util.h"

namespace aff::quant {
namespace {

using testing::ScratchDir;
namespace fs = std::filesystem;

struct LegacyEntry {
  std::string name;
  int32_t ncall;
  std::vector<float> values;  // as stored: mean square × ncall
};

std::vector<uint8_t> legacy_bytes(const std::vector<LegacyEntry>& entries, bool trailer = true) {
  std::vector<uint8_t> b;
  auto put_i32 = [&](int32_t v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + 4);
  };
  put_i32(int32_t(entries.size()));
  for (const auto& e : entries) {
    put_i32(int32_t(e.name.size()));
    b.insert(b.end(), e.name.begin(), e.name.end());
    put_i32(e.ncall);
    put_i32(int32_t(e.values.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(e.values.data());
    b.insert(b.end(), p, p + e.values.size() * 4);
  }
  if (trailer) {
    put_i32(17);
    const std::string ds = "calibration.txt";
    put_i32(int32_t(ds.size()));
    b.insert(b.end(), ds.begin(), ds.end());
  }
  return b;
}

std::vector<float> random_positive(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.01f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(Imatrix, LegacyDividesByCallsAndSlicesExperts) {
  std::mt19937 rng(std::random_device{}());
  const int64_t n_cols = 96, n_exp = 5;
  const auto dense = random_positive(n_cols, rng);
  const auto experts = random_positive(size_t(n_cols * n_exp), rng);
  const auto bytes = legacy_bytes({{"blk.0.attn_q_a.weight", 4, dense}, {"blk.3.ffn_up_exps.weight", 7, experts}});
  auto im = Imatrix::parse_legacy(bytes, "mem.dat");
  ASSERT_TRUE(im.is_ok()) << im.status().message();
  EXPECT_EQ(im->format(), Imatrix::Format::kLegacy);
  EXPECT_EQ(im->size(), 2u);
  auto d = im->importance("blk.0.attn_q_a.weight", n_cols, 1, 0);
  ASSERT_TRUE(d.is_ok());
  ASSERT_EQ(d->size(), size_t(n_cols));
  for (int64_t i = 0; i < n_cols; ++i) EXPECT_FLOAT_EQ((*d)[size_t(i)], dense[size_t(i)] / 4.0f);
  auto e3 = im->importance("blk.3.ffn_up_exps.weight", n_cols, n_exp, 3);
  ASSERT_TRUE(e3.is_ok());
  for (int64_t i = 0; i < n_cols; ++i) EXPECT_FLOAT_EQ((*e3)[size_t(i)], experts[size_t(3 * n_cols + i)] / 7.0f);
  // Absent tensor: no importance. Wrong width: an error naming the entry.
  EXPECT_TRUE(im->importance("blk.9.attn_q_a.weight", n_cols, 1, 0)->empty());
  auto bad = im->importance("blk.3.ffn_up_exps.weight", n_cols + 1, n_exp, 0);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("blk.3.ffn_up_exps.weight"), std::string::npos);
  // Legacy has no per-expert counts.
  EXPECT_FALSE(im->matrix_counts("blk.3.ffn_up_exps.weight", n_exp).has_value());
  // Without the optional trailer it parses the same.
  EXPECT_TRUE(Imatrix::parse_legacy(legacy_bytes({{"x.weight", 1, dense}}, false), "m").is_ok());
}

TEST(Imatrix, LegacyHostileFilesAreRejected) {
  std::mt19937 rng(std::random_device{}());
  const auto good = legacy_bytes({{"blk.0.attn_kv.weight", 2, random_positive(64, rng)}});
  for (size_t cut : {size_t(0), size_t(3), size_t(9), good.size() - 40}) {
    std::vector<uint8_t> t(good.begin(), good.begin() + long(cut));
    EXPECT_EQ(Imatrix::parse_legacy(t, "trunc").status().code(), StatusCode::kCorrupt) << cut;
  }
  auto huge = good;
  const int32_t n = 1 << 30;
  std::memcpy(huge.data(), &n, 4);
  EXPECT_EQ(Imatrix::parse_legacy(huge, "count").status().code(), StatusCode::kCorrupt);
  auto neg = legacy_bytes({{"x.weight", 1, {1.0f, -2.0f}}});
  EXPECT_EQ(Imatrix::parse_legacy(neg, "neg").status().code(), StatusCode::kCorrupt);
  auto dup = legacy_bytes({{"x.weight", 1, {1.0f}}, {"x.weight", 1, {2.0f}}});
  EXPECT_EQ(Imatrix::parse_legacy(dup, "dup").status().code(), StatusCode::kCorrupt);
}

// Writes a GGUF imatrix: <name>.in_sum2 [n_cols, n_mat] and <name>.counts [1, n_mat].
void write_gguf_imatrix(const std::string& path, const std::string& name, int64_t n_cols,
                        const std::vector<float>& sum2, const std::vector<float>& counts) {
  format::GgufWriter w(path);
  ASSERT_TRUE(w.set("general.type", format::GgufValue::string("imatrix")).is_ok());
  ASSERT_TRUE(w.set("imatrix.chunk_count", format::GgufValue::u32(10)).is_ok());
  ASSERT_TRUE(w.set("imatrix.chunk_size", format::GgufValue::u32(512)).is_ok());
  ASSERT_TRUE(w.set("imatrix.datasets", format::GgufValue::array_strings({"calib.txt"})).is_ok());
  const int64_t n_mat = int64_t(counts.size());
  ASSERT_TRUE(w.add_tensor(name + ".in_sum2", GgmlType::kF32, {n_cols, n_mat}).is_ok());
  ASSERT_TRUE(w.add_tensor(name + ".counts", GgmlType::kF32, {1, n_mat}).is_ok());
  ASSERT_TRUE(w.write_header().is_ok());
  ASSERT_TRUE(w.append({reinterpret_cast<const uint8_t*>(sum2.data()), sum2.size() * 4}).is_ok());
  ASSERT_TRUE(w.append({reinterpret_cast<const uint8_t*>(counts.data()), counts.size() * 4}).is_ok());
  ASSERT_TRUE(w.finish().is_ok());
}

TEST(Imatrix, GgufPerExpertCountsAndMeans) {
  ScratchDir dir;
  std::mt19937 rng(std::random_device{}());
  const int64_t n_cols = 64, n_exp = 6;
  const auto sum2 = random_positive(size_t(n_cols * n_exp), rng);
  std::vector<float> counts = {12, 0, 3, 40, 1, 9};
  const std::string path = dir.str("imatrix.gguf");
  write_gguf_imatrix(path, "blk.2.ffn_gate_exps.weight", n_cols, sum2, counts);
  auto im = Imatrix::load(path);
  ASSERT_TRUE(im.is_ok()) << im.status().message();
  EXPECT_EQ(im->format(), Imatrix::Format::kGguf);
  for (int64_t e = 0; e < n_exp; ++e) {
    auto r = im->importance("blk.2.ffn_gate_exps.weight", n_cols, n_exp, e);
    ASSERT_TRUE(r.is_ok());
    if (counts[size_t(e)] == 0) {
      EXPECT_TRUE(r->empty()) << "an expert never hit has no importance";
      continue;
    }
    ASSERT_EQ(r->size(), size_t(n_cols));
    for (int64_t i = 0; i < n_cols; ++i) {
      EXPECT_FLOAT_EQ((*r)[size_t(i)], sum2[size_t(e * n_cols + i)] / counts[size_t(e)]);
    }
  }
  auto c = im->matrix_counts("blk.2.ffn_gate_exps.weight", n_exp);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, counts);
  EXPECT_FALSE(im->matrix_counts("blk.2.ffn_gate_exps.weight", n_exp + 1).has_value());
  // A legacy file with the same name is sniffed as legacy.
  const auto legacy = legacy_bytes({{"blk.2.ffn_gate_exps.weight", 1, sum2}});
  testing::write_file(dir.path() / "imatrix.dat", legacy.data(), legacy.size());
  auto l = Imatrix::load(dir.str("imatrix.dat"));
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l->format(), Imatrix::Format::kLegacy);
  EXPECT_EQ(Imatrix::load(dir.str("missing.dat")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace aff::quant
