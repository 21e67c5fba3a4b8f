// Engine/Session over a random-weight checkpoint in the official layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <vector>

#include "affinity/engine.h"
#include "model/dsv4/synthetic_checkpoint.h"
#include "runtime/model_path.h"
#include "tokenizer/tokenizer.h"

namespace aff {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 1031;  // covers the test tokenizer's ids

class EngineTest : public ::testing::Test {
 protected:
  static inline fs::path root_, model_;

  static void SetUpTestSuite() {
    std::mt19937_64 rng(std::random_device{}());
    root_ = fs::temp_directory_path() / ("aff_engine_" + std::to_string(rng()));
    model_ = root_ / "tiny";
    dsv4::ModelConfig cfg = dsv4::synthetic_tiny_config();
    cfg.vocab_size = kVocab;
    dsv4::SyntheticCheckpointOptions opts;
    opts.seed = rng();
    ASSERT_TRUE(dsv4::write_synthetic_checkpoint(cfg, model_.string(), opts).is_ok());
    fs::copy_file(fs::path(AFFINITY_TEST_DATA) / "tokenizer" / "tiny_tokenizer.json", model_ / "tokenizer.json");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static std::unique_ptr<Engine> load(int chunk = 0, int64_t ctx = 0) {
    EngineOptions o;
    o.model_path = model_.string();
    o.threads = 1;
    o.prefill_chunk_size = chunk;
    o.ctx_size = ctx;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return e.is_ok() ? std::move(e).value() : nullptr;
  }

  static std::vector<int32_t> random_tokens(size_t n) {
    static std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int32_t> d(0, int32_t(kVocab - 1));
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = d(rng);
    return t;
  }
};

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(EngineTest, InfoDescribesTheModel) {
  auto e = load();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->info().name, "tiny");
  EXPECT_EQ(e->info().source, model_.string());
  EXPECT_EQ(e->info().vocab_size, kVocab);
  EXPECT_EQ(e->info().max_context, 4096);  // the synthetic config's max_position_embeddings
  EXPECT_EQ(e->info().bos_id, 0);
  EXPECT_EQ(e->info().eos_id, 1);
  EXPECT_GT(e->tokenizer().vocab_size(), 1000);
  EXPECT_EQ(load(0, 97)->info().max_context, 97);
  EXPECT_EQ(e->new_session(33)->max_positions(), 33);
  EXPECT_EQ(e->new_session(1 << 20)->max_positions(), 4096);
}

TEST_F(EngineTest, ChunkedEvalMatchesOneShotAndIncremental) {
  const std::vector<int32_t> tokens = random_tokens(41);  // crosses the 16-token window and several compressions
  auto one = load();
  auto chunked = load(/*chunk=*/7);
  ASSERT_TRUE(one && chunked);

  auto s1 = one->new_session();
  std::vector<float> all1;
  ASSERT_TRUE(s1->eval(tokens, &all1).is_ok());
  ASSERT_EQ(all1.size(), tokens.size() * size_t(kVocab));
  EXPECT_EQ(s1->n_past(), 41);
  EXPECT_EQ(max_abs_diff(s1->last_logits(), std::span(all1).subspan(all1.size() - size_t(kVocab))), 0.0f);

  auto s2 = chunked->new_session();
  std::vector<float> all2;
  ASSERT_TRUE(s2->eval(tokens, &all2).is_ok());
  EXPECT_LE(max_abs_diff(all1, all2), 1e-4f);

  // Prompt, then one token at a time: each step's logits equal the matching row.
  auto s3 = chunked->new_session();
  ASSERT_TRUE(s3->eval(std::span(tokens).first(30)).is_ok());
  EXPECT_LE(max_abs_diff(s3->last_logits(), std::span(all1).subspan(29 * size_t(kVocab), size_t(kVocab))), 1e-4f);
  for (size_t i = 30; i < tokens.size(); ++i) {
    ASSERT_TRUE(s3->eval(std::span(tokens).subspan(i, 1)).is_ok());
    EXPECT_LE(max_abs_diff(s3->last_logits(), std::span(all1).subspan(i * size_t(kVocab), size_t(kVocab))), 1e-4f)
        << "position " << i;
  }
}

TEST_F(EngineTest, ResetStartsAFreshTimeline) {
  auto e = load();
  ASSERT_TRUE(e);
  const std::vector<int32_t> a = random_tokens(19), b = random_tokens(23);
  auto s = e->new_session();
  ASSERT_TRUE(s->eval(a).is_ok());
  const std::vector<float> first(s->last_logits().begin(), s->last_logits().end());
  ASSERT_TRUE(s->eval(b).is_ok());
  s->reset();
  EXPECT_EQ(s->n_past(), 0);
  EXPECT_TRUE(s->last_logits().empty());
  ASSERT_TRUE(s->eval(a).is_ok());
  EXPECT_LE(max_abs_diff(s->last_logits(), first), 1e-6f);
}

TEST_F(EngineTest, BadInputFailsWithoutAdvancing) {
  auto e = load();
  ASSERT_TRUE(e);
  auto s = e->new_session(20);
  ASSERT_TRUE(s->eval(random_tokens(15)).is_ok());

  std::vector<int32_t> bad = random_tokens(3);
  bad[1] = int32_t(kVocab);
  Status st = s->eval(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(std::to_string(kVocab)), std::string::npos) << st.message();
  bad[1] = -4;
  EXPECT_EQ(s->eval(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->n_past(), 15);

  st = s->eval(random_tokens(6));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("context full"), std::string::npos) << st.message();
  EXPECT_EQ(s->n_past(), 15);
  EXPECT_TRUE(s->eval(random_tokens(5)).is_ok());  // exactly fills it
  EXPECT_EQ(s->n_past(), 20);
}

TEST_F(EngineTest, LoadErrorsNameWhatIsWrong) {
  EngineOptions o;
  o.model_path = (root_ / "absent").string();
  auto r = Engine::load(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(o.model_path), std::string::npos);

  o.model_path = model_.string();
  o.tokenizer_path = (root_ / "absent.json").string();
  r = Engine::load(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("absent.json"), std::string::npos);

  // A tokenizer with ids the model has no embedding rows for.
  const fs::path small = root_ / "small_vocab";
  dsv4::ModelConfig cfg = dsv4::synthetic_tiny_config();  // vocab 263 < the tokenizer's ~1013
  ASSERT_TRUE(dsv4::write_synthetic_checkpoint(cfg, small.string()).is_ok());
  fs::copy_file(model_ / "tokenizer.json", small / "tokenizer.json");
  o.model_path = small.string();
  o.tokenizer_path.clear();
  r = Engine::load(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("vocab_size is 263"), std::string::npos) << r.status().message();
}

TEST(ModelPath, PrefersTheDefaultNameThenTheFirstModelDir) {
  std::mt19937_64 rng(std::random_device{}());
  const fs::path root = fs::temp_directory_path() / ("aff_models_" + std::to_string(rng()));
  const fs::path empty_root = root / "empty";
  fs::create_directories(empty_root);
  fs::create_directories(root / "models" / "b_model");
  fs::create_directories(root / "models" / "a_not_a_model");
  std::ofstream(root / "models" / "b_model" / "config.json") << "{}";
  fs::create_directories(root / "models" / "c_model");
  std::ofstream(root / "models" / "c_model" / "config.json") << "{}";

  auto r = runtime::find_default_model({empty_root.string(), (root / "models").string()});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(fs::path(r.value()).filename(), "b_model");

  fs::create_directories(root / "models" / runtime::kDefaultModelName);
  std::ofstream(root / "models" / runtime::kDefaultModelName / "config.json") << "{}";
  r = runtime::find_default_model({(root / "models").string()});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(fs::path(r.value()).filename(), runtime::kDefaultModelName);

  r = runtime::find_default_model({empty_root.string(), (root / "missing").string()});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(empty_root.string()), std::string::npos);
  fs::remove_all(root);
}

}  // namespace
}  // namespace aff
