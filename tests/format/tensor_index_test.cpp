// TensorIndex over sharded and single-file checkpoints, and the ways an index
// can disagree with its shards.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "format/safetensors_writer.h"
#include "format/tensor_index.h"

namespace aff::format {
namespace {

namespace fs = std::filesystem;

class TensorIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("aff_index_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    rng_.seed(std::random_device{}());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<uint8_t> bytes(size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = uint8_t(rng_());
    return b;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  // Two shards and an index mapping a.* to the first and b.* to the second.
  void write_sharded() {
    SafetensorsWriter s1, s2;
    a_ = bytes(7 * 3 * 4);
    b_ = bytes(5);
    s1.add("a.weight", DType::kF32, {7, 3}, a_);
    s1.add("a.scale", DType::kF8E8M0, {1, 1}, bytes(1));
    s2.add("b.weight", DType::kI8, {5}, b_);
    ASSERT_TRUE(s1.write(path("model-00001-of-00002.safetensors")).is_ok());
    ASSERT_TRUE(s2.write(path("model-00002-of-00002.safetensors")).is_ok());
    write_text(kSafetensorsIndexName, R"({"metadata": {"total_size": 90}, "weight_map": {
      "a.weight": "model-00001-of-00002.safetensors",
      "a.scale": "model-00001-of-00002.safetensors",
      "b.weight": "model-00002-of-00002.safetensors"}})");
  }

  fs::path dir_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> a_, b_;
};

void expect_error(const Status& s, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(s.is_ok());
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message() << "\n  lacks: " << n;
}

TEST_F(TensorIndexTest, ShardedLookups) {
  write_sharded();
  auto idx = TensorIndex::open_dir(dir_.string());
  ASSERT_TRUE(idx.is_ok()) << idx.status().message();
  EXPECT_EQ(idx->tensors().size(), 3u);
  EXPECT_EQ(idx->shards().size(), 2u);
  EXPECT_EQ(idx->keep_alive().size(), 2u);
  const TensorView* a = idx->find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(0, std::memcmp(a->data, a_.data(), a_.size()));
  EXPECT_NE(a->file.find("model-00001-of-00002.safetensors"), std::string::npos);
  auto b = idx->get("b.weight");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(0, std::memcmp(b->data, b_.data(), b_.size()));
  EXPECT_NE(b->file.find("model-00002-of-00002.safetensors"), std::string::npos);
  auto missing = idx->get("c.weight");
  expect_error(missing.status(), {kSafetensorsIndexName, "'c.weight'", "missing"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(TensorIndexTest, ViewsOutliveTheIndexObjectThroughKeepAlive) {
  write_sharded();
  std::vector<std::shared_ptr<void>> keep;
  TensorView a;
  {
    auto idx = TensorIndex::open_dir(dir_.string());
    ASSERT_TRUE(idx.is_ok());
    keep = idx->keep_alive();
    a = *idx->find("a.weight");
  }
  EXPECT_EQ(0, std::memcmp(a.data, a_.data(), a_.size()));
}

TEST_F(TensorIndexTest, MissingShardNamesIndexShardAndTensor) {
  write_sharded();
  fs::remove(path("model-00002-of-00002.safetensors"));
  expect_error(TensorIndex::open_dir(dir_.string()).status(),
               {kSafetensorsIndexName, "model-00002-of-00002.safetensors", "'b.weight'"});
}

TEST_F(TensorIndexTest, TensorAbsentFromItsShard) {
  write_sharded();
  write_text(kSafetensorsIndexName, R"({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
      "b.weight": "model-00001-of-00002.safetensors"}})");
  expect_error(TensorIndex::open_dir(dir_.string()).status(),
               {kSafetensorsIndexName, "'b.weight'", "model-00001-of-00002.safetensors", "does not contain"});
}

TEST_F(TensorIndexTest, CorruptShardNamesShardAndTensor) {
  write_sharded();
  fs::resize_file(path("model-00001-of-00002.safetensors"), fs::file_size(path("model-00001-of-00002.safetensors")) - 3);
  expect_error(TensorIndex::open_dir(dir_.string()).status(),
               {kSafetensorsIndexName, "model-00001-of-00002.safetensors", "'a.scale'", "truncated"});
}

TEST_F(TensorIndexTest, BadIndexFiles) {
  write_sharded();
  write_text(kSafetensorsIndexName, R"({"weight_map": )");
  expect_error(TensorIndex::open_dir(dir_.string()).status(), {kSafetensorsIndexName, "not valid JSON"});
  write_text(kSafetensorsIndexName, R"({"metadata": {}})");
  expect_error(TensorIndex::open_dir(dir_.string()).status(), {kSafetensorsIndexName, "weight_map"});
  write_text(kSafetensorsIndexName, R"({"weight_map": {"a.weight": 3}})");
  expect_error(TensorIndex::open_dir(dir_.string()).status(), {kSafetensorsIndexName, "'a.weight'"});
  write_text(kSafetensorsIndexName, R"({"weight_map": {"a.weight": "../outside.safetensors"}})");
  expect_error(TensorIndex::open_dir(dir_.string()).status(),
               {kSafetensorsIndexName, "'a.weight'", "../outside.safetensors", "plain file name"});
}

TEST_F(TensorIndexTest, LoneModelSafetensors) {
  SafetensorsWriter w;
  auto x = bytes(2 * 9);
  w.add("x", DType::kBF16, {9}, x);
  ASSERT_TRUE(w.write(path(kSafetensorsSingleName)).is_ok());
  auto idx = TensorIndex::open_dir(dir_.string());
  ASSERT_TRUE(idx.is_ok()) << idx.status().message();
  EXPECT_EQ(0, std::memcmp(idx->find("x")->data, x.data(), x.size()));
  expect_error(idx->get("y").status(), {kSafetensorsSingleName, "'y'"});
}

TEST_F(TensorIndexTest, EmptyOrMissingDirectory) {
  expect_error(TensorIndex::open_dir(dir_.string()).status(), {dir_.string(), kSafetensorsIndexName});
  expect_error(TensorIndex::open_dir(path("absent")).status(), {"absent", "not a directory"});
}

}  // namespace
}  // namespace aff::format
