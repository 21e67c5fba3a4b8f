// Whole-checkpoint loading: synthetic checkpoints in the official layout load
// with every value intact, and every way a checkpoint can be broken gives one
// Status naming the file and the tensor or field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "format/safetensors_writer.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/synthetic_checkpoint.h"

namespace aff::dsv4 {
namespace {

namespace fs = std::filesystem;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    dir_ = fs::temp_directory_path() / ("aff_loader_" + std::to_string(seed_) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small shard limit forces many shards even for the tiny model.
  void write(const ModelConfig& c, bool single_file = false) {
    SyntheticCheckpointOptions o;
    o.seed = seed_;
    o.max_shard_bytes = 96 * 1024;
    o.single_file = single_file;
    ASSERT_TRUE(write_synthetic_checkpoint(c, dir_.string(), o).is_ok());
  }
  Result<std::unique_ptr<LoadedModel>> load() const { return load_checkpoint_dir(dir_.string()); }

  // The shard holding `name`, per the index.
  std::string shard_of(const std::string& name) const {
    auto idx = format::TensorIndex::open_dir(dir_.string());
    EXPECT_TRUE(idx.is_ok()) << idx.status().message();
    return idx->find(name)->file;
  }

  // Rewrites the shard holding `name`: `edit` may drop or replace tensors.
  void rewrite_shard_of(const std::string& name,
                        const std::function<void(const std::string& tensor, format::SafetensorsWriter&,
                                                 DType, std::vector<int64_t>, std::vector<uint8_t>)>& edit) {
    const std::string path = shard_of(name);
    format::SafetensorsWriter w;
    {
      auto f = format::open_safetensors(path);
      ASSERT_TRUE(f.is_ok());
      for (const TensorView& v : (*f)->tensors) {
        edit(v.name, w, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes));
      }
    }  // unmapped before the file is rewritten
    ASSERT_TRUE(w.write(path).is_ok());
  }
  void replace_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    rewrite_shard_of(name, [&](const std::string& t, format::SafetensorsWriter& w, DType d, std::vector<int64_t> s,
                               std::vector<uint8_t> b) {
      if (t != name) return w.add(t, d, std::move(s), std::move(b));
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      w.add(t, dtype, shape, std::vector<uint8_t>(size_t(n) * size_t(dtype_size(dtype)), 0x11));
    });
  }
  void drop_tensor(const std::string& name) {
    rewrite_shard_of(name, [&](const std::string& t, format::SafetensorsWriter& w, DType d, std::vector<int64_t> s,
                               std::vector<uint8_t> b) {
      if (t != name) w.add(t, d, std::move(s), std::move(b));
    });
  }
  void edit_index(const std::function<void(nlohmann::json&)>& f) const {
    const fs::path p = dir_ / format::kSafetensorsIndexName;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(p));
    f(j);
    std::ofstream(p) << j.dump();
  }

  uint64_t seed_ = 0;
  fs::path dir_;
};

void expect_error(const Status& s, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(s.is_ok());
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message() << "\n  lacks: " << n;
}

// Every tensor the writer stored comes back byte-identical through the loader.
void expect_round_trip(const ModelConfig& cfg, const format::TensorIndex& idx, uint64_t seed) {
  auto plan = synthetic_checkpoint_plan(cfg);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  size_t tensors = 0;
  for (const SyntheticUnit& u : *plan) {
    for (const SyntheticTensor& t : synthetic_unit_tensors(cfg, u, seed)) {
      const TensorView* v = idx.find(t.name);
      ASSERT_NE(v, nullptr) << t.name;
      EXPECT_EQ(v->dtype, t.dtype) << t.name;
      EXPECT_EQ(v->shape, t.shape) << t.name;
      ASSERT_EQ(v->nbytes, t.bytes.size()) << t.name;
      EXPECT_EQ(0, std::memcmp(v->data, t.bytes.data(), t.bytes.size())) << t.name;
      ++tensors;
    }
  }
  EXPECT_EQ(tensors, idx.tensors().size());
}

std::vector<int64_t> S(std::initializer_list<int64_t> s) { return s; }

TEST_F(LoaderTest, ShardedSyntheticCheckpointRoundTrips) {
  const ModelConfig cfg = synthetic_tiny_config();
  write(cfg);
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const LoadedModel& lm = **m;
  EXPECT_EQ(lm.source, dir_.string());
  EXPECT_EQ(lm.config.variant, Variant::kV4Flash);
  EXPECT_EQ(lm.config.compress_ratios, cfg.compress_ratios);
  EXPECT_EQ(config_to_json(lm.config), config_to_json(cfg));
  EXPECT_GT(lm.keep_alive.size(), 3u);  // really sharded

  auto idx = format::TensorIndex::open_dir(dir_.string());
  ASSERT_TRUE(idx.is_ok());
  expect_round_trip(cfg, *idx, seed_);

  // The bound views are the stored tensors (same bytes), with the right formats.
  const ModelWeights& w = lm.weights;
  ASSERT_EQ(w.layers.size(), 5u);
  ASSERT_EQ(w.mtp.size(), 1u);
  EXPECT_FALSE(w.dspark.present());
  EXPECT_EQ(w.embed.shape, S({263, 160}));
  EXPECT_EQ(w.head.format, WeightFormat::kBF16);
  EXPECT_EQ(w.hc_head.fn.shape, S({4, 640}));
  EXPECT_EQ(w.hc_head.scale.shape, S({1}));
  for (int l = 0; l < 5; ++l) {
    SCOPED_TRACE(l);
    const LayerWeights& L = w.layers[size_t(l)];
    const int ratio = cfg.compress_ratios[size_t(l)];
    EXPECT_EQ(L.index, l);
    EXPECT_EQ(L.hc_attn.fn.shape, S({24, 640}));
    EXPECT_EQ(L.hc_ffn.base.shape, S({24}));
    EXPECT_EQ(L.attn.wq_a.format, WeightFormat::kFP8Block);
    EXPECT_EQ(L.attn.wq_a.scale.shape, S({1, 2}));      // [ceil(48/128), ceil(160/128)]
    EXPECT_EQ(L.attn.wq_b.weight.shape, S({256, 48}));  // 4 heads x 64
    EXPECT_EQ(L.attn.wq_b.scale.shape, S({2, 1}));
    EXPECT_EQ(L.attn.wo_a.weight.shape, S({80, 128}));  // 2 groups x 40, (4/2) heads x 64
    EXPECT_EQ(L.attn.wo_b.weight.shape, S({160, 80}));
    EXPECT_EQ(L.attn.attn_sink.dtype, DType::kF32);
    EXPECT_EQ(L.attn.compressor.present, ratio != 0);
    EXPECT_EQ(L.attn.indexer.present, ratio == 4);
    if (ratio != 0) {
      EXPECT_EQ(L.attn.compressor.ratio, ratio);
      EXPECT_EQ(L.attn.compressor.overlap, ratio == 4);
      EXPECT_EQ(L.attn.compressor.ape.shape, ratio == 4 ? S({4, 128}) : S({8, 64}));
      EXPECT_EQ(L.attn.compressor.wkv.weight.dtype, DType::kBF16);
      EXPECT_EQ(L.attn.compressor.norm.shape, S({64}));
    }
    if (ratio == 4) {
      EXPECT_EQ(L.attn.indexer.wq_b.weight.shape, S({128, 48}));
      EXPECT_EQ(L.attn.indexer.weights_proj.weight.shape, S({4, 160}));
      EXPECT_EQ(L.attn.indexer.compressor.wkv.weight.shape, S({64, 160}));
      EXPECT_EQ(L.attn.indexer.compressor.ape.shape, S({4, 64}));
      EXPECT_EQ(L.attn.indexer.compressor.norm.shape, S({32}));
    }
    const bool hash = l < 2;
    EXPECT_EQ(L.ffn.tid2eid.valid(), hash);
    EXPECT_EQ(L.ffn.gate_bias.valid(), !hash);
    if (hash) {
      EXPECT_EQ(L.ffn.tid2eid.shape, S({263, 3}));
    }
    EXPECT_EQ(L.ffn.gate.weight.shape, S({8, 160}));
    ASSERT_EQ(L.ffn.experts.size(), 8u);
    for (const ExpertWeights& e : L.ffn.experts) {
      EXPECT_EQ(e.w1.format, WeightFormat::kMXFP4);
      EXPECT_EQ(e.w1.weight.shape, S({64, 80}));
      EXPECT_EQ(e.w1.scale.shape, S({64, 5}));
      EXPECT_EQ(e.w2.weight.shape, S({160, 32}));
      EXPECT_EQ(e.w2.scale.shape, S({160, 2}));
      EXPECT_EQ(e.w2.in, 64);
    }
    EXPECT_TRUE(L.ffn.has_shared);
    EXPECT_EQ(L.ffn.shared.w2.format, WeightFormat::kFP8Block);
  }
  const MtpWeights& mtp = w.mtp[0];
  EXPECT_EQ(mtp.block.index, 5);
  EXPECT_FALSE(mtp.block.attn.compressor.present);  // compress_ratios[5] == 0
  EXPECT_TRUE(mtp.block.ffn.gate_bias.valid());
  EXPECT_EQ(mtp.e_proj.weight.shape, S({160, 160}));
  EXPECT_EQ(mtp.hc_head.fn.shape, S({4, 640}));
  const TensorView* stored = idx->find("mtp.0.e_proj.weight");
  EXPECT_EQ(mtp.e_proj.weight.file, stored->file);
  EXPECT_EQ(0, std::memcmp(mtp.e_proj.weight.data, stored->data, stored->nbytes));

  // The writer quantised the official way: every FP8 tile's largest code is
  // in (224, 448] (power-of-two scale), every MXFP4 block's in [3, 6].
  const Linear& q = w.layers[3].attn.wq_b;
  for (int64_t bo = 0; bo < q.scale.dim(0); ++bo) {
    for (int64_t bi = 0; bi < q.scale.dim(1); ++bi) {
      float amax = 0;
      for (int64_t i = bo * 128; i < std::min<int64_t>(q.out, (bo + 1) * 128); ++i)
        for (int64_t j = bi * 128; j < std::min<int64_t>(q.in, (bi + 1) * 128); ++j)
          amax = std::max(amax, std::fabs(e4m3_to_f32(q.weight.data[i * q.in + j])));
      EXPECT_GT(amax, 224.0f);
      EXPECT_LE(amax, 448.0f);
    }
  }
  const Linear& x = w.layers[4].ffn.experts[7].w3;
  for (int64_t r = 0; r < x.out; ++r) {
    for (int64_t b = 0; b < x.in / 32; ++b) {
      float amax = 0;
      for (int k = 0; k < 16; ++k) {
        const uint8_t byte = x.weight.data[r * (x.in / 2) + b * 16 + k];
        amax = std::max({amax, std::fabs(kE2M1ToF32[byte & 15]), std::fabs(kE2M1ToF32[byte >> 4])});
      }
      EXPECT_GE(amax, 3.0f);
      EXPECT_LE(amax, 6.0f);
    }
  }
  // tid2eid rows hold distinct experts.
  const TensorView& t = w.layers[1].ffn.tid2eid;
  for (int64_t row = 0; row < t.dim(0); ++row) {
    const int64_t* ids = t.as<int64_t>() + row * 3;
    EXPECT_TRUE(ids[0] != ids[1] && ids[0] != ids[2] && ids[1] != ids[2]);
  }
}

TEST_F(LoaderTest, SingleFileAndDeterministic) {
  ModelConfig cfg = synthetic_tiny_config();
  write(cfg, /*single_file=*/true);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / format::kSafetensorsIndexName));
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ((*m)->keep_alive.size(), 1u);
  auto idx = format::TensorIndex::open_dir(dir_.string());
  ASSERT_TRUE(idx.is_ok());
  expect_round_trip(cfg, *idx, seed_);
  // A different seed gives different bytes.
  auto plan = synthetic_checkpoint_plan(cfg);
  ASSERT_TRUE(plan.is_ok());
  const auto a = synthetic_unit_tensors(cfg, (*plan)[1], 1);
  const auto b = synthetic_unit_tensors(cfg, (*plan)[1], 2);
  EXPECT_NE(a[0].bytes, b[0].bytes);
}

TEST_F(LoaderTest, NoMtpAndUnquantisedCheckpoint) {
  ModelConfig cfg = synthetic_tiny_config();
  cfg.num_mtp_layers = 0;
  cfg.compress_ratios.pop_back();
  cfg.fp8_dense = false;
  cfg.expert_dtype = "";
  cfg.num_hash_layers = 0;
  cfg.n_shared_experts = 0;
  write(cfg);
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const ModelWeights& w = (*m)->weights;
  EXPECT_TRUE(w.mtp.empty());
  EXPECT_EQ(w.layers[0].attn.wq_a.format, WeightFormat::kBF16);
  EXPECT_FALSE(w.layers[0].attn.wq_a.scale.valid());
  EXPECT_EQ(w.layers[0].ffn.experts[0].w1.format, WeightFormat::kBF16);
  EXPECT_FALSE(w.layers[0].ffn.tid2eid.valid());
  EXPECT_TRUE(w.layers[0].ffn.gate_bias.valid());
  EXPECT_FALSE(w.layers[0].ffn.has_shared);
}

TEST_F(LoaderTest, Fp8ExpertsAsInBaseCheckpoints) {
  ModelConfig cfg = synthetic_tiny_config();
  cfg.expert_dtype = "fp8";
  cfg.weight_block = 32;  // several tiles per expert matrix
  write(cfg);
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const Linear& w2 = (*m)->weights.layers[2].ffn.experts[5].w2;
  EXPECT_EQ(w2.format, WeightFormat::kFP8Block);
  EXPECT_EQ(w2.block, 32);
  EXPECT_EQ(w2.scale.shape, S({5, 2}));
}

TEST_F(LoaderTest, Flash0731DsparkStages) {
  const ModelConfig cfg = synthetic_tiny_config(Variant::kV4Flash0731);
  write(cfg);
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const LoadedModel& lm = **m;
  EXPECT_EQ(lm.config.variant, Variant::kV4Flash0731);
  EXPECT_EQ(lm.config.num_dspark_stages, 3);
  const ModelWeights& w = lm.weights;
  EXPECT_TRUE(w.mtp.empty());
  ASSERT_EQ(w.dspark.stages.size(), 3u);
  EXPECT_EQ(w.dspark.stages[2].index, 7);
  EXPECT_EQ(w.dspark.main_proj.weight.shape, S({160, 480}));
  EXPECT_EQ(w.dspark.markov_w1.shape, S({263, 16}));
  EXPECT_EQ(w.dspark.markov_w2.weight.shape, S({263, 16}));
  EXPECT_EQ(w.dspark.confidence_proj.weight.shape, S({1, 176}));
  EXPECT_EQ(w.dspark.hc_head.fn.shape, S({4, 640}));
  auto idx = format::TensorIndex::open_dir(dir_.string());
  ASSERT_TRUE(idx.is_ok());
  expect_round_trip(cfg, *idx, seed_);
  EXPECT_NE(idx->find("mtp.2.markov_head.markov_w1.weight"), nullptr);
  EXPECT_NE(idx->find("mtp.0.main_proj.scale"), nullptr);
}

TEST_F(LoaderTest, ConfigWithoutMtpIgnoresStoredMtpBlock) {
  write(synthetic_tiny_config());
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  j["num_nextn_predict_layers"] = 0;
  std::ofstream(dir_ / "config.json") << j.dump();
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_TRUE((*m)->weights.mtp.empty());
}

TEST_F(LoaderTest, TruncatedShard) {
  write(synthetic_tiny_config());
  const std::string shard = shard_of("layers.3.attn.wq_b.weight");
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto m = load();
  expect_error(m.status(), {fs::path(shard).filename().string(), "tensor '", "truncated"});
}

TEST_F(LoaderTest, MissingShard) {
  write(synthetic_tiny_config());
  const std::string shard = shard_of("layers.1.ffn.experts.3.w1.weight");
  fs::remove(shard);
  expect_error(load().status(), {format::kSafetensorsIndexName, fs::path(shard).filename().string(), "tensor '"});
}

TEST_F(LoaderTest, MissingTensorNamesTensorAndIndex) {
  write(synthetic_tiny_config());
  drop_tensor("layers.2.attn.indexer.compressor.ape");
  edit_index([](nlohmann::json& j) { j["weight_map"].erase("layers.2.attn.indexer.compressor.ape"); });
  auto m = load();
  expect_error(m.status(), {format::kSafetensorsIndexName, "'layers.2.attn.indexer.compressor.ape'", "missing"});
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

TEST_F(LoaderTest, IndexedTensorAbsentFromShard) {
  write(synthetic_tiny_config());
  const std::string shard = shard_of("layers.0.ffn.gate.tid2eid");
  drop_tensor("layers.0.ffn.gate.tid2eid");
  expect_error(load().status(), {format::kSafetensorsIndexName, "'layers.0.ffn.gate.tid2eid'",
                                 fs::path(shard).filename().string(), "does not contain"});
}

TEST_F(LoaderTest, MissingScaleOfFp8Weight) {
  write(synthetic_tiny_config());
  drop_tensor("layers.4.attn.wo_b.scale");
  edit_index([](nlohmann::json& j) { j["weight_map"].erase("layers.4.attn.wo_b.scale"); });
  expect_error(load().status(), {"'layers.4.attn.wo_b.scale'", "missing", "'layers.4.attn.wo_b.weight'"});
}

TEST_F(LoaderTest, WrongShape) {
  write(synthetic_tiny_config());
  const std::string shard = shard_of("layers.3.attn.wq_b.weight");
  replace_tensor("layers.3.attn.wq_b.weight", DType::kF8E4M3, {64, 96});
  expect_error(load().status(), {fs::path(shard).filename().string(), "tensor 'layers.3.attn.wq_b.weight'",
                                 "shape [64, 96] does not match the expected [256, 48]"});
}

TEST_F(LoaderTest, WrongScaleShape) {
  write(synthetic_tiny_config());
  replace_tensor("layers.1.ffn.experts.6.w2.scale", DType::kF8E8M0, {160, 3});
  expect_error(load().status(), {"'layers.1.ffn.experts.6.w2.scale'", "[160, 3]", "[160, 2]"});
}

TEST_F(LoaderTest, WrongDtypes) {
  write(synthetic_tiny_config());
  replace_tensor("layers.1.attn_norm.weight", DType::kI32, {160});
  expect_error(load().status(), {"'layers.1.attn_norm.weight'", "dtype I32", "BF16 or F32"});

  write(synthetic_tiny_config());  // fresh copy
  replace_tensor("layers.0.ffn.experts.2.w3.weight", DType::kBF16, {64, 160});
  expect_error(load().status(), {"'layers.0.ffn.experts.2.w3.weight'", "dtype BF16", "expert_dtype 'fp4'"});

  write(synthetic_tiny_config());
  replace_tensor("layers.2.attn.attn_sink", DType::kBF16, {4});
  expect_error(load().status(), {"'layers.2.attn.attn_sink'", "dtype BF16", "F32"});

  write(synthetic_tiny_config());
  replace_tensor("layers.2.ffn.gate.weight", DType::kF8E4M3, {8, 160});
  expect_error(load().status(), {"'layers.2.ffn.gate.weight'", "dtype F8_E4M3"});

  write(synthetic_tiny_config());
  replace_tensor("layers.3.attn.wkv.scale", DType::kF32, {1, 2});
  expect_error(load().status(), {"'layers.3.attn.wkv.scale'", "dtype F32", "F8_E8M0"});
}

TEST_F(LoaderTest, BoundDenseLinearMayBeStoredBf16) {
  // wo_a dequantised to BF16 (as the official converter does) is accepted.
  write(synthetic_tiny_config());
  replace_tensor("layers.3.attn.wo_a.weight", DType::kBF16, {80, 128});
  auto m = load();
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ((*m)->weights.layers[3].attn.wo_a.format, WeightFormat::kBF16);
  EXPECT_FALSE((*m)->weights.layers[3].attn.wo_a.scale.valid());
}

TEST_F(LoaderTest, ExpertIdsOutOfRange) {
  write(synthetic_tiny_config());
  rewrite_shard_of("layers.1.ffn.gate.tid2eid", [](const std::string& t, format::SafetensorsWriter& w, DType d,
                                                   std::vector<int64_t> s, std::vector<uint8_t> b) {
    if (t == "layers.1.ffn.gate.tid2eid") {
      const int64_t bad = 8;  // == n_routed_experts
      std::memcpy(b.data() + 8 * (17 * 3 + 2), &bad, 8);
    }
    w.add(t, d, std::move(s), std::move(b));
  });
  expect_error(load().status(), {"'layers.1.ffn.gate.tid2eid'", "expert id 8 at [17, 2]", "[0, 8)"});
}

TEST_F(LoaderTest, BrokenConfigs) {
  write(synthetic_tiny_config());
  std::ofstream(dir_ / "config.json") << "{ not json";
  expect_error(load().status(), {"config.json", "JSON"});

  fs::remove(dir_ / "config.json");
  expect_error(load().status(), {"config.json"});

  fs::create_directory(dir_ / "config.json");  // unreadable: a directory
  expect_error(load().status(), {"config.json"});
  fs::remove(dir_ / "config.json");

  nlohmann::json j = nlohmann::json::parse(config_to_json(synthetic_tiny_config()));
  j["model_type"] = "deepseek_v41";
  std::ofstream(dir_ / "config.json") << j.dump();
  auto m = load();
  expect_error(m.status(), {"config.json", "V4.1"});
  EXPECT_EQ(m.status().code(), StatusCode::kUnsupported);

  // A config for a bigger model than the stored tensors: the first mismatch is named.
  j["model_type"] = "deepseek_v4";
  j["q_lora_rank"] = 64;
  std::ofstream(dir_ / "config.json") << j.dump();
  expect_error(load().status(), {"tensor 'layers.0.attn.wq_a.weight'", "[48, 160]", "[64, 160]"});

  expect_error(load_checkpoint_dir((dir_ / "nope").string()).status(), {"nope", "not a checkpoint directory"});
}

}  // namespace
}  // namespace aff::dsv4

namespace aff::dsv4 {
namespace {

// Checkpoints written by the independent Python oracle writer (the golden
// fixtures) load, and hold exactly the tensors our layout expects: no more, no less.
TEST(IndependentCheckpoints, GoldenFixturesLoadWithExactlyTheExpectedTensors) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(AFFINITY_TEST_DATA) / "golden";
  int checked = 0;
  if (fs::is_directory(root)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (!fs::exists(entry.path() / "config.json")) continue;
      SCOPED_TRACE(entry.path().string());
      auto m = load_checkpoint_dir(entry.path().string());
      ASSERT_TRUE(m.is_ok()) << m.status().message();
      auto idx = format::TensorIndex::open_dir(entry.path().string());
      ASSERT_TRUE(idx.is_ok());
      auto plan = synthetic_checkpoint_plan((*m)->config);
      ASSERT_TRUE(plan.is_ok());
      size_t expected = 0;
      for (const SyntheticUnit& u : *plan) {
        if (!u.is_linear) {
          EXPECT_NE(idx->find(u.name), nullptr) << u.name;
          ++expected;
          continue;
        }
        const TensorView* w = idx->find(u.name + ".weight");
        ASSERT_NE(w, nullptr) << u.name;
        ++expected;
        if (w->dtype == DType::kF8E4M3 || w->dtype == DType::kI8) ++expected;  // its .scale
      }
      EXPECT_EQ(idx->tensors().size(), expected);
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no golden checkpoints under " << root;
}

}  // namespace
}  // namespace aff::dsv4
